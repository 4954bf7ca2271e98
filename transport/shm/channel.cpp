#include "h2/transport/shm/channel.hpp"

#include "h2/transport/block_heap.hpp"
#include "h2/transport/ring.hpp"
#include "h2/transport/socket_link.hpp"
#include "h2/transport/spin.hpp"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <linux/futex.h>
#include <mutex>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

namespace h2::transport::shm {

namespace {

// -- futex on shared memory (no FUTEX_PRIVATE_FLAG: across processes) --------

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000),
              static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT,
            expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE,
            INT_MAX, nullptr, nullptr, 0);
}

/// Bumps `seq` and wakes whoever sleeps on it.
void signal(std::atomic<std::uint32_t>& seq) noexcept {
  seq.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&seq);
}

/// Counts a sleeper in a `*_waiting` word while it lives, so that the
/// other side knows to signal() it.
class counted_sleeper {
public:
  explicit counted_sleeper(std::atomic<std::uint32_t>& waiting)
      : waiting_(waiting) {
    waiting_.fetch_add(1, std::memory_order_seq_cst);
  }
  ~counted_sleeper() { waiting_.fetch_sub(1, std::memory_order_seq_cst); }
  counted_sleeper(const counted_sleeper&) = delete;
  counted_sleeper& operator=(const counted_sleeper&) = delete;

private:
  std::atomic<std::uint32_t>& waiting_;
};

// -- the segment --------------------------------------------------------------

/// One direction. The ring carries frames: head and tail count bytes since
/// the start; the writer owns head, the reader tail. Sleepers count
/// themselves in a `*_waiting` word and sleep on a sequence word the other
/// side bumps after it moves (an eventcount): receives on data_seq, the
/// writer on space_seq, the reader's drain thread on drain_seq (bumped when
/// the writer finds the ring full). Large tensor payloads go to blocks of
/// the heap instead (block_heap, the writer's); the reader frees a block by
/// pushing its offset to the free queue: freed_head counts pushes (the
/// reader's), freed_tail the writer's takes.
struct ring_control {
  alignas(64) std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
  alignas(64) std::atomic<std::uint32_t> data_seq{0};
  std::atomic<std::uint32_t> readers_waiting{0};
  alignas(64) std::atomic<std::uint32_t> space_seq{0};
  std::atomic<std::uint32_t> writer_waiting{0};
  alignas(64) std::atomic<std::uint32_t> drain_seq{0};
  alignas(64) std::atomic<std::uint32_t> writer_closed{0};
  std::atomic<std::uint32_t> reader_closed{0};
  alignas(64) std::atomic<std::uint64_t> freed_head{0};
  alignas(64) std::atomic<std::uint64_t> freed_tail{0};
};

constexpr std::uint64_t segment_magic = 0x6d68735f4432480bULL;
constexpr std::size_t control_bytes = 4096;

/// Payloads smaller than this stream through the ring: a second copy of
/// them costs less than a block's bookkeeping.
constexpr std::uint64_t min_placed_bytes = 64 << 10;
/// Heap blocks start on pages (fast copies, no false sharing).
constexpr std::uint64_t block_alignment = 4096;
/// The most a segment may hold of ring or of heap per direction.
constexpr std::uint64_t max_region_bytes = std::uint64_t{1} << 40;

/// What the acceptor tells the dialer with the segment.
struct segment_sizes {
  std::uint64_t ring_bytes = 0; ///< each direction's ring
  std::uint64_t heap_bytes = 0; ///< each direction's heap (0: none)

  /// Entries of each direction's free queue: more blocks than this cannot
  /// be live at once.
  std::uint64_t free_slots() const { return heap_bytes / min_placed_bytes; }

  static std::uint64_t pages(std::uint64_t bytes) {
    return (bytes + 4095) / 4096 * 4096;
  }
  std::uint64_t ring_at(int direction) const {
    return control_bytes +
           static_cast<std::uint64_t>(direction) * pages(ring_bytes);
  }
  std::uint64_t heap_at(int direction) const {
    return ring_at(2) + static_cast<std::uint64_t>(direction) * heap_bytes;
  }
  std::uint64_t free_queue_at(int direction) const {
    return heap_at(2) +
           static_cast<std::uint64_t>(direction) * pages(8 * free_slots());
  }
  std::uint64_t total() const { return free_queue_at(2); }
};

struct segment_header {
  std::uint64_t magic;
  segment_sizes sizes;
  ring_control rings[2]; ///< [0]: acceptor -> dialer, [1]: dialer -> acceptor
};
static_assert(sizeof(segment_header) <= control_bytes);

/// The mapping, shared by the link and by every received tensor that lives
/// in it: unmapped when the last of them goes.
struct segment {
  void* map = nullptr;
  std::size_t bytes = 0;
  /// Serialises this process's pushes to the free queue (tensors die on
  /// any thread).
  std::mutex free_mutex;

  ~segment() {
    if (map != nullptr)
      ::munmap(map, bytes);
  }

  char* at(std::uint64_t offset) const {
    return static_cast<char*>(map) + offset;
  }
};

/// How long a sleeping side waits before it checks that its peer lives,
/// and how often the drain thread takes what nobody waits for.
constexpr std::chrono::milliseconds liveness_interval{20};
/// How long the writer spins before it sleeps for room.
constexpr std::chrono::microseconds spin_wanted{50};
/// The longest a writer waits for the reader to free a heap block it has
/// used before rather than take fresh memory (shm_link::allocate_block).
constexpr std::chrono::milliseconds free_wait{2};

class shm_link final : public polled_link {
public:
  shm_link(std::shared_ptr<segment> seg, bool acceptor,
           std::unique_ptr<socket_link> socket)
      : segment_(std::move(seg)),
        socket_(std::move(socket)),
        sizes_(static_cast<segment_header*>(segment_->map)->sizes),
        heap_(sizes_.heap_bytes, block_alignment) {
    auto* h = static_cast<segment_header*>(segment_->map);
    const int out = acceptor ? 0 : 1, in = 1 - out;
    out_ = &h->rings[out];
    in_ = &h->rings[in];
    out_data_ = segment_->at(sizes_.ring_at(out));
    in_data_ = segment_->at(sizes_.ring_at(in));
    out_heap_ = segment_->at(sizes_.heap_at(out));
    in_heap_ = segment_->at(sizes_.heap_at(in));
    out_free_ =
      reinterpret_cast<std::uint64_t*>(segment_->at(sizes_.free_queue_at(out)));
    in_free_ =
      reinterpret_cast<std::uint64_t*>(segment_->at(sizes_.free_queue_at(in)));
  }

  ~shm_link() override { shutdown(); }

  void write(std::initializer_list<buffer_view> parts) override {
    const std::uint64_t capacity = sizes_.ring_bytes;
    for (const auto& part : parts) {
      const char* p = static_cast<const char*>(part.data);
      std::size_t left = part.size;
      while (left > 0) {
        std::uint64_t head = out_->head.load(std::memory_order_relaxed);
        std::uint64_t free_bytes = 0;
        auto has_room = [&] {
          if (out_->reader_closed.load(std::memory_order_acquire) != 0)
            throw transport_error(transport_errc::peer_closed,
                                  "shm peer " + peer() + " closed the channel");
          std::uint64_t tail = out_->tail.load(std::memory_order_acquire);
          if (!ring::consistent(head, tail, capacity))
            throw transport_error(transport_errc::corrupt_frame,
                                  "corrupt frame: the shm peer moved its "
                                  "ring's tail past the data");
          free_bytes = ring::free_space(head, tail, capacity);
          return free_bytes > 0;
        };
        while (!has_room()) {
          // Nobody may be reading (receives read for themselves): have the
          // peer's drain thread make room.
          signal(out_->drain_seq);
          wait(has_room, out_->space_seq, out_->writer_waiting,
               out_->space_seq.load(std::memory_order_seq_cst), std::nullopt,
               spin_budget(spin_wanted));
        }
        std::size_t n = std::min<std::uint64_t>(free_bytes, left);
        ring::copy_in(out_data_, capacity, head, p, n);
        out_->head.store(head + n, std::memory_order_seq_cst);
        if (out_->readers_waiting.load(std::memory_order_seq_cst) != 0)
          signal(out_->data_seq);
        p += n;
        left -= n;
      }
    }
  }

  std::optional<wire::placement> place(buffer_view payload) override {
    if (payload.size < min_placed_bytes || payload.size > heap_.capacity())
      return std::nullopt;
    auto at = allocate_block(payload.size);
    if (!at)
      return std::nullopt; // no room: it streams through the ring
    std::memcpy(out_heap_ + *at, payload.data, payload.size);
    return wire::placement{*at, payload.size};
  }

  adopted_payload adopt(const wire::placement& p) override {
    const std::uint64_t heap = sizes_.heap_bytes;
    if (p.bytes == 0 || p.offset % block_alignment != 0 || p.offset >= heap ||
        p.bytes > heap - p.offset)
      throw transport_error(transport_errc::corrupt_frame,
                            "corrupt frame: the shm peer placed " +
                              std::to_string(p.bytes) + " bytes at offset " +
                              std::to_string(p.offset) + " of a heap of " +
                              std::to_string(heap) + " bytes");
    return {in_heap_ + p.offset,
            [seg = segment_, in = in_, queue = in_free_,
             slots = sizes_.free_slots(), offset = p.offset] {
              std::lock_guard<std::mutex> guard(seg->free_mutex);
              auto head = in->freed_head.load(std::memory_order_relaxed);
              auto tail = in->freed_tail.load(std::memory_order_acquire);
              // Only a writer that placed more blocks than its heap holds
              // fills the queue: that block stays lost to it.
              if (head - tail >= slots)
                return;
              queue[head % slots] = offset;
              in->freed_head.store(head + 1, std::memory_order_seq_cst);
              if (in->writer_waiting.load(std::memory_order_seq_cst) != 0)
                signal(in->space_seq);
            }};
  }

  std::size_t read_some(void* data, std::size_t size) override {
    check_shut();
    const std::uint64_t capacity = sizes_.ring_bytes;
    std::uint64_t tail = in_->tail.load(std::memory_order_relaxed);
    std::uint64_t head = in_->head.load(std::memory_order_acquire);
    if (head == tail) {
      if (in_->writer_closed.load(std::memory_order_acquire) == 0)
        return 0;
      // Closed: what it wrote before it closed is delivered first.
      head = in_->head.load(std::memory_order_acquire);
      if (head == tail)
        throw transport_error(transport_errc::peer_closed,
                              "shm peer " + peer() + " closed the channel");
    }
    if (!ring::consistent(head, tail, capacity))
      throw transport_error(transport_errc::corrupt_frame,
                            "corrupt frame: the shm peer moved its ring's "
                            "head past the ring");
    std::size_t n = std::min<std::uint64_t>(head - tail, size);
    ring::copy_out(in_data_, capacity, tail, data, n);
    in_->tail.store(tail + n, std::memory_order_seq_cst);
    if (in_->writer_waiting.load(std::memory_order_seq_cst) != 0)
      signal(in_->space_seq);
    return n;
  }

  void read(void* data, std::size_t size,
            std::optional<deadline> until) override {
    auto* p = static_cast<char*>(data);
    while (size > 0) {
      std::size_t n = 0;
      try {
        const std::uint32_t seen = wake_count();
        n = read_some(p, size);
        if (n == 0)
          wait_readable(seen, until.value_or(deadline::max()));
      } catch (const transport_error& e) {
        if (e.code() == transport_errc::peer_closed &&
            p != static_cast<char*>(data))
          throw transport_error(transport_errc::corrupt_frame,
                                "corrupt frame: shm peer ended the stream "
                                "inside a frame");
        throw;
      }
      p += n;
      size -= n;
    }
  }

  std::uint32_t wake_count() const noexcept override {
    return in_->data_seq.load(std::memory_order_seq_cst);
  }

  void wait_readable(std::uint32_t seen, deadline until) override {
    wait([&] { return readable(); }, in_->data_seq, in_->readers_waiting, seen,
         until, std::chrono::nanoseconds(0));
  }

  void nudge() noexcept override { signal(in_->data_seq); }

  void wait_drain() override {
    const std::uint32_t seen = in_->drain_seq.load(std::memory_order_seq_cst);
    check_shut();
    futex_wait(&in_->drain_seq, seen, liveness_interval);
    check_shut();
    if (!readable() && socket_->peer_gone())
      throw transport_error(transport_errc::peer_closed,
                            "shm peer process is gone");
  }

  void shutdown() noexcept override {
    if (shut_.exchange(true))
      return;
    out_->writer_closed.store(1, std::memory_order_seq_cst);
    in_->reader_closed.store(1, std::memory_order_seq_cst);
    for (auto* r : {out_, in_})
      for (auto* w : {&r->data_seq, &r->space_seq, &r->drain_seq})
        signal(*w);
    socket_->shutdown();
  }

  std::string_view backend() const noexcept override { return "shm"; }
  std::string peer() const override { return "(same host)"; }

private:
  bool readable() const noexcept {
    return in_->head.load(std::memory_order_acquire) !=
             in_->tail.load(std::memory_order_relaxed) ||
           in_->writer_closed.load(std::memory_order_acquire) != 0;
  }

  /// A block of the heap for `bytes`, or nullopt (the payload streams).
  /// Memory the heap used before is preferred while the reader is freeing
  /// blocks: a fresh page costs a fault per 4 KiB (10-17 us each on the
  /// VMs measured, 3-4 ms per MiB, twenty times the copy) and a streamed
  /// payload a second copy, so a writer that ran ahead waits up to
  /// free_wait for the reader to return a block first. A reader that keeps
  /// its tensors (a pipeline stage holding activations) stops the waiting
  /// until it frees one again.
  std::optional<std::uint64_t> allocate_block(std::uint64_t bytes) {
    take_freed_blocks();
    std::optional<std::chrono::steady_clock::time_point> until;
    for (;;) {
      auto at = heap_.where(bytes);
      const bool warm = at && *at + bytes <= heap_.high_water();
      if (warm || heap_.blocks() == 0 || reader_holds_)
        return heap_.allocate(bytes);
      if (!until) // only a wait reads the clock
        until = std::chrono::steady_clock::now() + free_wait;
      if (!wait_for_free(*until)) {
        reader_holds_ = true;
        return heap_.allocate(bytes);
      }
      take_freed_blocks();
    }
  }

  /// Waits until the reader returned a block or `until`; false at `until`.
  bool wait_for_free(std::chrono::steady_clock::time_point until) {
    auto arrived = [&] {
      return out_->freed_head.load(std::memory_order_seq_cst) !=
             out_->freed_tail.load(std::memory_order_relaxed);
    };
    if (spin_until(arrived, spin_budget(spin_wanted)))
      return true;
    counted_sleeper counted(out_->writer_waiting);
    for (;;) {
      const std::uint32_t seen =
        out_->space_seq.load(std::memory_order_seq_cst);
      check_shut();
      if (arrived())
        return true;
      const auto left = until - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds(0))
        return false;
      futex_wait(&out_->space_seq, seen, left);
    }
  }

  /// Returns the blocks the reader freed to the heap. A bad offset from the
  /// reader is ignored: it can only waste its own heap.
  void take_freed_blocks() noexcept {
    const std::uint64_t slots = sizes_.free_slots();
    std::uint64_t head = out_->freed_head.load(std::memory_order_acquire);
    std::uint64_t tail = out_->freed_tail.load(std::memory_order_relaxed);
    if (head - tail > slots) // a corrupt reader: skip what it claims
      tail = head;
    if (tail != head)
      reader_holds_ = false;
    for (; tail != head; ++tail)
      (void)heap_.release(out_free_[tail % slots]);
    out_->freed_tail.store(tail, std::memory_order_release);
  }

  /// Spins for `spin`, then sleeps on `seq`, counted in `waiting` so that
  /// the other side wakes it, until `ready()` or until `seq` moves from
  /// `seen`; checks this end's shutdown, the peer's liveness and `until`
  /// meanwhile.
  template <class Ready>
  void wait(Ready&& ready, std::atomic<std::uint32_t>& seq,
            std::atomic<std::uint32_t>& waiting, std::uint32_t seen,
            std::optional<deadline> until, std::chrono::nanoseconds spin) {
    auto woken = [&] {
      return seq.load(std::memory_order_seq_cst) != seen;
    };
    if (spin_until([&] { return check_shut(), ready() || woken(); }, spin))
      return;
    counted_sleeper counted(waiting);
    for (;;) {
      check_shut();
      if (ready() || woken())
        return;
      auto slice = liveness_interval;
      if (until) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          *until - std::chrono::steady_clock::now());
        if (left.count() <= 0)
          throw transport_error(transport_errc::timeout,
                                "shm peer sent nothing in time");
        slice = std::min(slice, left);
      }
      futex_wait(&seq, seen, slice);
      check_shut();
      if (ready() || woken())
        return;
      if (socket_->peer_gone())
        throw transport_error(transport_errc::peer_closed,
                              "shm peer process is gone");
    }
  }

  void check_shut() const {
    if (shut_.load(std::memory_order_relaxed))
      throw transport_error(transport_errc::cancelled, "shm link was closed");
  }

  std::shared_ptr<segment> segment_;
  std::unique_ptr<socket_link> socket_; ///< kept open: tells peer death
  segment_sizes sizes_;
  block_heap heap_; ///< the blocks of out_heap_ (this end writes them)
  ring_control* out_;
  ring_control* in_;
  char* out_data_;
  char* in_data_;
  char* out_heap_;
  char* in_heap_;
  std::uint64_t* out_free_;
  std::uint64_t* in_free_;
  /// The last wait for a freed block timed out (allocate_block).
  bool reader_holds_ = false;
  std::atomic<bool> shut_{false};
};

// -- fd passing
// -------------------------------------------------------------------

void send_fd(int socket, int fd, segment_sizes sizes) {
  msghdr msg{};
  iovec iov{&sizes, sizeof(sizes)};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (::sendmsg(socket, &msg, MSG_NOSIGNAL) != sizeof(sizes))
    throw transport_error(transport_errc::peer_closed,
                          std::string("shm: cannot pass the segment: ") +
                            std::strerror(errno));
}

int receive_fd(int socket, segment_sizes& sizes, deadline until) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
    until - std::chrono::steady_clock::now());
  pollfd pfd{socket, POLLIN, 0};
  if (::poll(&pfd, 1, static_cast<int>(std::max<long long>(0, left.count()))) <=
      0)
    throw transport_error(transport_errc::timeout,
                          "shm: the segment did not arrive in time");
  msghdr msg{};
  iovec iov{&sizes, sizeof(sizes)};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (n != sizeof(sizes) || c == nullptr || c->cmsg_type != SCM_RIGHTS)
    throw transport_error(transport_errc::corrupt_frame,
                          "shm: the peer sent no segment");
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

void* map_segment(int fd, std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    throw transport_error(transport_errc::peer_closed,
                          std::string("shm: cannot map the segment: ") +
                            std::strerror(errno));
  return p;
}

sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract namespace: a leading NUL, no file system entry to clean up.
  std::memcpy(addr.sun_path + 1, name.data(),
              std::min(name.size(), sizeof(addr.sun_path) - 2));
  len =
    static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

// -- the backend
// --------------------------------------------------------------------

class shm_backend final : public backend {
public:
  explicit shm_backend(const endpoint_options& options)
      : sizes_{options.shm_ring_bytes,
               options.shm_heap_bytes / block_alignment * block_alignment} {
    if (sizes_.ring_bytes == 0 || sizes_.ring_bytes > max_region_bytes)
      throw config_error("transport.shm_ring_mb",
                         "the shm ring must hold more than 0 bytes and at "
                         "most 1 TiB");
    if (sizes_.heap_bytes > max_region_bytes)
      throw config_error("transport.shm_heap_mb",
                         "the shm heap must hold at most 1 TiB");
  }

  ~shm_backend() override { stop(); }

  std::string_view name() const noexcept override { return "shm"; }

  bool can_connect(const endpoint_address& a,
                   const endpoint_address& b) const override {
    return !a.shm_socket.empty() && !b.shm_socket.empty() &&
           a.host_id == b.host_id;
  }

  void start(
    endpoint_address& local,
    std::function<void(std::unique_ptr<byte_link>)> on_connection) override {
    unsigned char rnd[8];
    RAND_bytes(rnd, sizeof(rnd));
    char hex[17];
    for (int i = 0; i < 8; ++i)
      std::snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    name_ = "h2-shm-" + std::to_string(::getpid()) + "-" + hex;
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = 0;
    auto addr = abstract_address(name_, len);
    if (listener_ < 0 ||
        ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listener_, SOMAXCONN) != 0)
      throw transport_error(transport_errc::peer_closed,
                            std::string("shm: cannot listen: ") +
                              std::strerror(errno));
    local.shm_socket = name_;
    thread_ = std::thread([this, cb = std::move(on_connection)] {
      for (;;) {
        int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (stopped_.load()) {
          if (fd >= 0)
            ::close(fd);
          return;
        }
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED)
            continue;
          return;
        }
        cb(std::make_unique<socket_link>(fd, "shm", "(same host)"));
      }
    });
  }

  std::unique_ptr<byte_link> connect(const endpoint_address& peer,
                                     deadline until) override {
    socklen_t len = 0;
    auto addr = abstract_address(peer.shm_socket, len);
    for (;;) {
      int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0 &&
          ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0)
        return std::make_unique<socket_link>(fd, "shm", "(same host)");
      int err = errno;
      if (fd >= 0)
        ::close(fd);
      if (std::chrono::steady_clock::now() >= until)
        throw transport_error(transport_errc::timeout,
                              std::string("shm: cannot reach node ") +
                                std::to_string(peer.node_rank) + ": " +
                                std::strerror(err));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::unique_ptr<byte_link> upgrade(std::unique_ptr<byte_link> bootstrap,
                                     bool acceptor, deadline until) override {
    std::unique_ptr<socket_link> socket(
      static_cast<socket_link*>(bootstrap.release()));
    segment_sizes sizes = sizes_;
    int fd = -1;
    if (acceptor) {
      fd = ::memfd_create("h2-shm", MFD_CLOEXEC);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(sizes.total())) != 0)
        throw transport_error(transport_errc::peer_closed,
                              std::string("shm: cannot create a segment: ") +
                                std::strerror(errno));
    } else {
      fd = receive_fd(socket->fd(), sizes, until);
      if (sizes.ring_bytes == 0 || sizes.ring_bytes > max_region_bytes ||
          sizes.heap_bytes > max_region_bytes ||
          sizes.heap_bytes % block_alignment != 0) {
        ::close(fd);
        throw transport_error(transport_errc::corrupt_frame,
                              "shm: the peer's segment is malformed");
      }
    }
    auto seg = std::make_shared<segment>();
    seg->bytes = sizes.total();
    try {
      seg->map = map_segment(fd, seg->bytes);
      auto* h = static_cast<segment_header*>(seg->map);
      if (acceptor) {
        new (h) segment_header{segment_magic, sizes, {}};
        send_fd(socket->fd(), fd, sizes);
      } else if (h->magic != segment_magic ||
                 h->sizes.ring_bytes != sizes.ring_bytes ||
                 h->sizes.heap_bytes != sizes.heap_bytes) {
        throw transport_error(transport_errc::corrupt_frame,
                              "shm: the peer's segment is malformed");
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    // The mapping keeps the segment alive; the descriptor is not needed.
    ::close(fd);
    return std::make_unique<shm_link>(std::move(seg), acceptor,
                                      std::move(socket));
  }

  void stop() noexcept override {
    if (stopped_.exchange(true))
      return;
    if (listener_ >= 0)
      ::shutdown(listener_, SHUT_RDWR);
    if (thread_.joinable())
      thread_.join();
    if (listener_ >= 0)
      ::close(listener_);
  }

private:
  segment_sizes sizes_;
  std::string name_;
  int listener_ = -1;
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

} // namespace

std::unique_ptr<backend> make_backend(const endpoint_options& options) {
  return std::make_unique<shm_backend>(options);
}

} // namespace h2::transport::shm
