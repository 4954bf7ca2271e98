#include "h2/transport/rdma/channel.hpp"

#include "h2/transport/ring.hpp"
#include "h2/transport/socket_link.hpp"
#include "h2/transport/spin.hpp"
#include "h2/transport/tcp/channel.hpp"

#include <h2/config.hpp>
#if H2_HAS_CUDA
#include "h2/devices/cuda/context.hpp"
#endif

#include <infiniband/verbs.h>
#include <openssl/rand.h>
#include <rdma/rdma_cma.h>

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace h2::transport::rdma {

namespace {

using namespace std::chrono_literals;

// -- sizes and bounds ---------------------------------------------------------

constexpr std::uint64_t min_ring_bytes = std::uint64_t{64} << 10;
/// Credits travel as 32-bit immediates: a ring holds at most 1 GiB.
constexpr std::uint64_t max_ring_bytes = std::uint64_t{1} << 30;
/// Largest single write; smaller writes let copying into the staging ring
/// overlap the transfer of what was copied before.
constexpr std::uint64_t max_write_bytes = std::uint64_t{1} << 20;
/// Notifying writes in flight per direction (each takes one of the peer's
/// posted receives until its bytes are returned).
constexpr std::uint32_t max_notifications = 128;
/// Receives posted: the peer's data notifications plus its credits, which
/// are bounded by our own notifications in flight (ring.hpp), plus slack.
constexpr std::uint32_t recv_depth = 2 * max_notifications + 16;
/// Sends: up to two writes per notification (a wrapped transfer), credits.
constexpr std::uint32_t send_depth = 3 * max_notifications + 16;
constexpr int cq_depth = static_cast<int>(recv_depth + send_depth + 64);
/// Sends from device memory below this size are staged (the lookup would
/// cost more than the copy).
constexpr std::size_t device_direct_min_bytes = std::size_t{64} << 10;

/// How long a sleeping side waits before it checks that its peer lives.
constexpr std::chrono::milliseconds liveness_interval{20};
/// How long a side spins before it sleeps.
constexpr std::chrono::microseconds spin_budget{50};
/// How long close() lets posted writes land before it tells the peer.
constexpr std::chrono::milliseconds drain_budget{1000};
constexpr int resolve_timeout_ms = 2000;

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

[[noreturn]] void fail_setup(const std::string& what) {
  throw transport_error(transport_errc::peer_closed, "rdma: " + what);
}

// -- owning handles -----------------------------------------------------------

template <auto Destroy>
struct destroyer {
  template <class T>
  void operator()(T* p) const noexcept {
    (void)Destroy(p);
  }
};

using channel_ptr =
  std::unique_ptr<rdma_event_channel, destroyer<&rdma_destroy_event_channel>>;
using id_ptr = std::unique_ptr<rdma_cm_id, destroyer<&rdma_destroy_id>>;
using pd_ptr = std::unique_ptr<ibv_pd, destroyer<&ibv_dealloc_pd>>;
using comp_ptr =
  std::unique_ptr<ibv_comp_channel, destroyer<&ibv_destroy_comp_channel>>;
using cq_ptr = std::unique_ptr<ibv_cq, destroyer<&ibv_destroy_cq>>;
using mr_ptr = std::unique_ptr<ibv_mr, destroyer<&ibv_dereg_mr>>;

/// The queue pair rdma_cm created on an id; destroyed before the id.
struct qp_guard {
  rdma_cm_id* id = nullptr;
  qp_guard() = default;
  qp_guard(const qp_guard&) = delete;
  qp_guard& operator=(const qp_guard&) = delete;
  ~qp_guard() {
    if (id != nullptr && id->qp != nullptr)
      rdma_destroy_qp(id);
  }
};

/// Page-aligned anonymous memory (registered memory must not share pages
/// with the heap: a fork would copy-on-write them away from the device).
class region {
public:
  region() = default;
  explicit region(std::size_t bytes) : bytes_(bytes) {
    data_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data_ == MAP_FAILED) {
      data_ = nullptr;
      fail_setup(errno_text("mmap of a ring"));
    }
  }
  region(region&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  region& operator=(region&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~region() {
    if (data_ != nullptr)
      ::munmap(data_, bytes_);
  }

  char* data() const noexcept { return static_cast<char*>(data_); }
  std::size_t bytes() const noexcept { return bytes_; }

private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// An owned file descriptor.
class fd_guard {
public:
  explicit fd_guard(int fd = -1) : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  int get() const noexcept { return fd_; }

private:
  int fd_;
};

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    fail_setup(errno_text("fcntl"));
}

// -- records on the bootstrap connection --------------------------------------

constexpr std::uint32_t record_magic = 0x44523248; // "H2RD"
constexpr std::uint16_t record_version = 1;

void put(std::byte* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out[i] = static_cast<std::byte>(v >> (8 * i));
}

std::uint64_t get(const std::byte* in, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return v;
}

/// The acceptor's offer: connect to my rdma_cm port with this token.
struct offer {
  std::uint64_t token = 0;
  std::uint16_t cm_port = 0;
};
constexpr std::size_t offer_bytes = 16; // magic, version, port, token

/// Where a peer may write: its receive ring.
struct ring_info {
  std::uint64_t address = 0;
  std::uint32_t rkey = 0;
  std::uint64_t capacity = 0;
};
constexpr std::size_t ring_info_bytes = 32; // magic, version, 0, addr, rkey,
                                            // 0, capacity

/// The dialer's rdma_cm private data: the token.
constexpr std::size_t private_data_bytes = 16; // magic, 0, token

void check_record(const std::byte* in, const std::string& peer) {
  if (get(in, 4) != record_magic)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: rdma peer " + peer +
                            " sent no queue-pair setup");
  if (get(in + 4, 2) != record_version)
    throw transport_error(transport_errc::protocol_mismatch,
                          "rdma peer " + peer +
                            " speaks another queue-pair setup version");
}

void send_offer(socket_link& s, const offer& o) {
  std::byte b[offer_bytes] = {};
  put(b, record_magic, 4);
  put(b + 4, record_version, 2);
  put(b + 6, o.cm_port, 2);
  put(b + 8, o.token, 8);
  s.write({{b, sizeof(b)}});
}

offer receive_offer(socket_link& s, deadline until) {
  std::byte b[offer_bytes];
  s.read(b, sizeof(b), until);
  check_record(b, s.peer());
  return {get(b + 8, 8), static_cast<std::uint16_t>(get(b + 6, 2))};
}

void send_ring(socket_link& s, const ring_info& r) {
  std::byte b[ring_info_bytes] = {};
  put(b, record_magic, 4);
  put(b + 4, record_version, 2);
  put(b + 8, r.address, 8);
  put(b + 16, r.rkey, 4);
  put(b + 24, r.capacity, 8);
  s.write({{b, sizeof(b)}});
}

ring_info receive_ring(socket_link& s, deadline until) {
  std::byte b[ring_info_bytes];
  s.read(b, sizeof(b), until);
  check_record(b, s.peer());
  ring_info r{get(b + 8, 8), static_cast<std::uint32_t>(get(b + 16, 4)),
              get(b + 24, 8)};
  if (r.capacity < min_ring_bytes || r.capacity > max_ring_bytes)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: rdma peer " + s.peer() +
                            " offers a ring of " + std::to_string(r.capacity) +
                            " bytes");
  return r;
}

std::uint64_t random_token() {
  std::uint64_t t = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&t), sizeof(t)) != 1)
    throw error("rdma: no randomness for a connection token");
  return t;
}

// -- rdma_cm events -----------------------------------------------------------

/// Waits up to `until` for the next event of `channel` (non-blocking fd) and
/// acknowledges it; returns its type and status.
std::pair<rdma_cm_event_type, int> next_event(rdma_event_channel* channel,
                                              deadline until,
                                              const std::string& where) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(channel, &ev) == 0) {
      auto out = std::make_pair(ev->event, ev->status);
      rdma_ack_cm_event(ev);
      return out;
    }
    if (errno != EAGAIN && errno != EINTR)
      fail_setup(where + ": " + errno_text("rdma_get_cm_event"));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      until - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw transport_error(transport_errc::timeout,
                            "rdma: " + where + ": no answer in time");
    pollfd pfd{channel->fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 100)));
  }
}

void expect_event(rdma_event_channel* channel, rdma_cm_event_type expected,
                  deadline until, const std::string& where) {
  auto [type, status] = next_event(channel, until, where);
  if (type != expected)
    fail_setup(where + ": " + rdma_event_str(type) + " (status " +
               std::to_string(status) + "), expected " +
               rdma_event_str(expected));
}

rdma_event_channel* new_event_channel() {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr)
    fail_setup(errno_text("rdma_create_event_channel"));
  return ch;
}

// -- the link -----------------------------------------------------------------

/// What a work request was, in the top bits of its id; the rest is the
/// stream position a write ends at.
enum class wr_kind : std::uint64_t { write = 1, credit = 2, receive = 3 };
constexpr int kind_shift = 62;
constexpr std::uint64_t position_mask = (std::uint64_t{1} << kind_shift) - 1;

std::uint64_t wr_id(wr_kind k, std::uint64_t position = 0) {
  return (static_cast<std::uint64_t>(k) << kind_shift) |
         (position & position_mask);
}

wr_kind kind_of(std::uint64_t id) {
  return static_cast<wr_kind>(id >> kind_shift);
}

/// One RC queue pair and its two rings. One thread writes at a time
/// (framed_channel serialises), one reads; both drive the completion queue
/// under `mutex_`.
class rdma_link final : public byte_link {
public:
  /// Takes the connection's rdma_cm id (its address resolved, or a
  /// connection request) and its own event channel; creates the queue pair
  /// and the receive ring and posts every receive, ready for
  /// rdma_connect/rdma_accept.
  rdma_link(channel_ptr channel, id_ptr id, std::unique_ptr<socket_link> socket,
            std::uint64_t ring_bytes)
      : channel_(std::move(channel)),
        id_(std::move(id)),
        socket_(std::move(socket)),
        peer_(socket_->peer()),
        capacity_(ring_bytes),
        reader_(ring_bytes, ring_bytes / 4),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (wake_.get() < 0)
      fail_setup(errno_text("eventfd"));
    ibv_context* verbs = id_->verbs;
    if (verbs == nullptr)
      fail_setup("the connection to " + peer_ + " has no device");
    pd_.reset(ibv_alloc_pd(verbs));
    if (!pd_)
      fail_setup(errno_text("ibv_alloc_pd"));
    comp_.reset(ibv_create_comp_channel(verbs));
    if (!comp_)
      fail_setup(errno_text("ibv_create_comp_channel"));
    set_nonblocking(comp_->fd);
    cq_.reset(ibv_create_cq(verbs, cq_depth, nullptr, comp_.get(), 0));
    if (!cq_)
      fail_setup(errno_text("ibv_create_cq"));
    ibv_qp_init_attr qa{};
    qa.send_cq = cq_.get();
    qa.recv_cq = cq_.get();
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = 1; // every send completes visibly: it frees a slot
    qa.cap.max_send_wr = send_depth;
    qa.cap.max_recv_wr = recv_depth;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(id_.get(), pd_.get(), &qa) != 0)
      fail_setup(errno_text("rdma_create_qp"));
    qp_.id = id_.get();
    in_ring_ = region(capacity_);
    in_mr_.reset(ibv_reg_mr(pd_.get(), in_ring_.data(), capacity_,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    if (!in_mr_)
      fail_setup(errno_text("ibv_reg_mr of the receive ring"));
    // Receives must be posted before the peer can write (an immediate
    // consumes one); a queue pair takes them from its INIT state on.
    for (std::uint32_t i = 0; i < recv_depth; ++i)
      if (int rc = post_receive(); rc != 0)
        fail_setup(std::string("ibv_post_recv: ") + std::strerror(rc));
  }

  ~rdma_link() override { shutdown(); }

  rdma_cm_id* id() const noexcept { return id_.get(); }
  rdma_event_channel* channel() const noexcept { return channel_.get(); }
  socket_link& socket() const noexcept { return *socket_; }

  /// After the queue pair connected: tells the peer where to write, learns
  /// where it may write, and registers the staging ring that mirrors the
  /// peer's ring.
  void exchange_rings(deadline until) {
    send_ring(*socket_, {reinterpret_cast<std::uint64_t>(in_ring_.data()),
                         in_mr_->rkey, capacity_});
    ring_info peer = receive_ring(*socket_, until);
    staging_ = region(peer.capacity);
    staging_mr_.reset(ibv_reg_mr(pd_.get(), staging_.data(), peer.capacity,
                                 IBV_ACCESS_LOCAL_WRITE));
    if (!staging_mr_)
      fail_setup(errno_text("ibv_reg_mr of the staging ring"));
    remote_ = peer;
    chunk_bytes_ = std::max<std::uint64_t>(
      4096, std::min<std::uint64_t>(max_write_bytes, peer.capacity / 4));
    std::lock_guard<std::mutex> guard(mutex_);
    writer_.emplace(peer.capacity, max_notifications);
  }

  void write(std::initializer_list<buffer_view> parts) override {
    for (const auto& part : parts) {
      if (part.size == 0)
        continue;
      if (part.size >= device_direct_min_bytes) {
        if (ibv_mr* mr = device_region(part.data, part.size)) {
          flush();
          write_direct(static_cast<const char*>(part.data), part.size, mr);
          continue;
        }
      }
      write_staged(static_cast<const char*>(part.data), part.size);
    }
    flush();
  }

  void read(void* data, std::size_t size,
            std::optional<deadline> until) override {
    char* p = static_cast<char*>(data);
    const char* start = p;
    while (size > 0) {
      std::uint64_t available = 0, at = 0;
      try {
        wait(
          [&] {
            available = reader_.available();
            at = reader_.consumed();
            return available > 0;
          },
          until);
      } catch (const transport_error& e) {
        if (p == start || e.code() != transport_errc::peer_closed)
          throw;
        throw transport_error(transport_errc::corrupt_frame,
                              "corrupt frame: rdma peer " + peer_ +
                                " ended the stream inside a frame (" +
                                e.what() + ")");
      }
      const std::size_t n = std::min<std::uint64_t>(available, size);
      ring::copy_out(in_ring_.data(), capacity_, at, p, n);
      {
        std::lock_guard<std::mutex> guard(mutex_);
        reader_.consume(n);
        send_credit_locked();
      }
      p += n;
      size -= n;
    }
  }

  void shutdown() noexcept override {
    if (shut_.exchange(true))
      return;
    // Writes already posted land before the peer hears of the close: the
    // bootstrap socket's end could otherwise overtake them.
    try {
      auto until = std::chrono::steady_clock::now() + drain_budget;
      while (std::chrono::steady_clock::now() < until) {
        {
          std::lock_guard<std::mutex> guard(mutex_);
          progress_locked();
          if (!writer_ || writer_->drained() || failure_)
            break;
        }
        if (socket_->peer_gone())
          break;
        std::this_thread::sleep_for(100us);
      }
    } catch (...) {
      // A broken link has nothing left to drain.
    }
    std::uint64_t one = 1;
    (void)::write(wake_.get(), &one, sizeof(one));
    {
      std::lock_guard<std::mutex> guard(mutex_);
      progressed_.notify_all();
    }
    rdma_disconnect(id_.get());
    socket_->shutdown();
  }

  std::string_view backend() const noexcept override { return "rdma"; }
  std::string peer() const override { return peer_; }

private:
  // -- writing ---------------------------------------------------------------

  /// Copies into the staging ring and posts a write whenever a chunk is
  /// full or the ring has no room left.
  void write_staged(const char* p, std::size_t left) {
    while (left > 0) {
      std::uint64_t room = 0, at = 0, posted = 0;
      {
        std::lock_guard<std::mutex> guard(mutex_);
        room = writer_->free_bytes();
        at = writer_->staged();
        posted = writer_->posted();
      }
      const std::uint64_t chunk_room = chunk_bytes_ - (at - posted);
      if (room == 0 || chunk_room == 0) {
        flush();
        wait([&] { return writer_->free_bytes() > 0; }, std::nullopt);
        continue;
      }
      const std::size_t n = std::min<std::uint64_t>({room, chunk_room, left});
      // Free places are the writer's alone: no lock while copying.
      ring::copy_in(staging_.data(), remote_.capacity, at, p, n);
      {
        std::lock_guard<std::mutex> guard(mutex_);
        writer_->stage(n);
      }
      p += n;
      left -= n;
      if (n == chunk_room)
        flush();
    }
  }

  /// Posts the staged and not yet posted bytes.
  void flush() {
    for (;;) {
      {
        std::lock_guard<std::mutex> guard(mutex_);
        if (writer_->posted() == writer_->staged())
          return;
      }
      wait_for_send_slot();
      std::lock_guard<std::mutex> guard(mutex_);
      if (!send_slot_free_locked())
        continue; // a credit took the slot meanwhile
      const std::uint64_t from = writer_->posted(), to = writer_->staged();
      const auto pieces = ring::split(from, to - from, remote_.capacity);
      post_write_locked(from, to, staging_.data() + pieces.first.offset,
                        staging_.data(), staging_mr_->lkey);
      return;
    }
  }

  /// Writes straight from registered (device) memory into the peer's ring;
  /// returns once the hardware read it all, so the caller may reuse it.
  void write_direct(const char* p, std::size_t left, ibv_mr* mr) {
    std::uint64_t end = 0;
    while (left > 0) {
      wait([&] { return writer_->free_bytes() > 0 && send_slot_free_locked(); },
           std::nullopt);
      std::lock_guard<std::mutex> guard(mutex_);
      if (!send_slot_free_locked())
        continue;
      const std::uint64_t at = writer_->staged();
      const std::size_t n =
        std::min<std::uint64_t>({writer_->free_bytes(), chunk_bytes_, left});
      writer_->stage(n);
      const auto pieces = ring::split(at, n, remote_.capacity);
      post_write_locked(at, at + n, p, p + pieces.first.bytes, mr->lkey);
      end = at + n;
      p += n;
      left -= n;
    }
    wait([&] { return writer_->completed() >= end; }, std::nullopt);
  }

  /// Whether one more notifying write (up to two work requests) may go.
  bool send_slot_free_locked() const {
    return writer_->may_notify() && sq_outstanding_ + 2 <= send_depth;
  }

  void wait_for_send_slot() {
    wait([&] { return send_slot_free_locked(); }, std::nullopt);
  }

  /// Posts [from, to) to the same positions of the peer's ring: the part up
  /// to the ring's end from `first`, the wrapped rest from `second`. Only
  /// the last write carries the immediate (the byte count): RC delivers in
  /// order, so its arrival means all of it landed.
  void post_write_locked(std::uint64_t from, std::uint64_t to,
                         const void* first, const void* second,
                         std::uint32_t lkey) {
    const auto pieces = ring::split(from, to - from, remote_.capacity);
    ibv_sge sge[2] = {};
    ibv_send_wr wr[2] = {};
    const void* sources[2] = {first, second};
    const ring::piece parts[2] = {pieces.first, pieces.second};
    const int count = pieces.count();
    std::uint64_t end = from;
    for (int i = 0; i < count; ++i) {
      end += parts[i].bytes;
      sge[i].addr = reinterpret_cast<std::uint64_t>(sources[i]);
      sge[i].length = static_cast<std::uint32_t>(parts[i].bytes);
      sge[i].lkey = lkey;
      wr[i].wr_id = wr_id(wr_kind::write, end);
      wr[i].sg_list = &sge[i];
      wr[i].num_sge = 1;
      wr[i].opcode = IBV_WR_RDMA_WRITE;
      wr[i].send_flags = IBV_SEND_SIGNALED;
      wr[i].wr.rdma.remote_addr = remote_.address + parts[i].offset;
      wr[i].wr.rdma.rkey = remote_.rkey;
      if (i + 1 < count)
        wr[i].next = &wr[i + 1];
    }
    ibv_send_wr& last = wr[count - 1];
    last.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    last.imm_data = htonl(static_cast<std::uint32_t>(to - from));
    ibv_send_wr* bad = nullptr;
    // Posting returns an errno value; errno itself is not set.
    if (int rc = ibv_post_send(id_->qp, wr, &bad); rc != 0)
      throw_failure_locked(transport_errc::peer_closed,
                           "rdma link to " + peer_ +
                             ": ibv_post_send: " + std::strerror(rc));
    sq_outstanding_ += static_cast<std::uint32_t>(count);
    writer_->post(to);
  }

  /// Returns consumed bytes to the writer when due (ring.hpp). When the
  /// send queue is full the credit waits for the next progress().
  void send_credit_locked() {
    const std::uint64_t due = reader_.credit_due();
    if (due == 0 || shut_.load() || failure_ || sq_outstanding_ >= send_depth)
      return;
    ibv_send_wr wr{};
    wr.wr_id = wr_id(wr_kind::credit);
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(static_cast<std::uint32_t>(due));
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(id_->qp, &wr, &bad); rc != 0) {
      record_failure_locked(transport_errc::peer_closed,
                            "rdma link to " + peer_ +
                              ": ibv_post_send: " + std::strerror(rc));
      return;
    }
    ++sq_outstanding_;
    reader_.credit_sent(due);
  }

  /// Posts one receive; returns 0 or an errno value.
  int post_receive() {
    // Zero-length: immediates carry no data into receive buffers.
    ibv_recv_wr wr{};
    wr.wr_id = wr_id(wr_kind::receive);
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(id_->qp, &wr, &bad);
  }

  // -- completions ------------------------------------------------------------

  void progress_locked() {
    ibv_wc wc[32];
    bool any = false;
    for (;;) {
      int n = ibv_poll_cq(cq_.get(), 32, wc);
      if (n < 0) {
        record_failure_locked(transport_errc::peer_closed,
                              "rdma link to " + peer_ + ": ibv_poll_cq failed");
        break;
      }
      for (int i = 0; i < n; ++i)
        complete_locked(wc[i]);
      any = any || n > 0;
      if (n < 32)
        break;
    }
    send_credit_locked();
    if (any || failure_)
      progressed_.notify_all(); // the other waiter may be waiting for these
  }

  void complete_locked(const ibv_wc& wc) {
    const wr_kind kind = kind_of(wc.wr_id);
    if (kind != wr_kind::receive)
      --sq_outstanding_;
    if (wc.status != IBV_WC_SUCCESS) {
      // After a close the queue pair flushes what was posted: no news.
      if (!shut_.load())
        record_failure_locked(
          transport_errc::peer_closed,
          "rdma link to " + peer_ + ": " + ibv_wc_status_str(wc.status) +
            " (vendor error " + std::to_string(wc.vendor_err) + ")");
      return;
    }
    switch (kind) {
      case wr_kind::write:
        writer_->complete(wc.wr_id & position_mask);
        return;
      case wr_kind::credit:
        return;
      case wr_kind::receive:
        break;
    }
    const std::uint32_t imm = ntohl(wc.imm_data);
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      if (!reader_.arrive(imm))
        record_failure_locked(transport_errc::corrupt_frame,
                              "corrupt frame: rdma peer " + peer_ +
                                " wrote past the receive ring");
    } else if (wc.opcode == IBV_WC_RECV &&
               (wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
      if (!writer_ || !writer_->credit(imm))
        record_failure_locked(transport_errc::corrupt_frame,
                              "corrupt frame: rdma peer " + peer_ +
                                " returned bytes it was never sent");
    } else {
      record_failure_locked(transport_errc::corrupt_frame,
                            "corrupt frame: unexpected message from rdma "
                            "peer " +
                              peer_);
    }
    if (int rc = post_receive(); rc != 0)
      record_failure_locked(transport_errc::peer_closed,
                            "rdma link to " + peer_ +
                              ": ibv_post_recv: " + std::strerror(rc));
  }

  void record_failure_locked(transport_errc code, const std::string& what) {
    if (!failure_)
      failure_.emplace(code, what);
  }

  [[noreturn]] void throw_failure_locked(transport_errc code,
                                         const std::string& what) {
    record_failure_locked(code, what);
    throw *failure_;
  }

  // -- waiting ----------------------------------------------------------------

  /// One look, under `mutex_`: this end's close, new completions,
  /// `ready()`, a failure.
  template <class Ready>
  bool look_locked(Ready& ready) {
    if (shut_.load())
      throw transport_error(transport_errc::cancelled,
                            "rdma link to " + peer_ + " was closed");
    progress_locked();
    if (ready())
      return true;
    if (failure_)
      throw *failure_;
    return false;
  }

  template <class Ready>
  bool attempt(Ready& ready) {
    std::lock_guard<std::mutex> guard(mutex_);
    return look_locked(ready);
  }

  /// The turn of the one waiting thread that sleeps on the completion
  /// channel. Both ends' threads (reader, writer) share one completion
  /// queue, and an armed queue raises one event: were both to sleep on the
  /// channel, the one that took the event could leave the other asleep with
  /// its completion already polled. So one sleeps there and the other on
  /// `progressed_`, which every progress and every end of a turn signals.
  /// Constructed and destroyed with `mutex_` held.
  struct poller_turn {
    explicit poller_turn(rdma_link& l) : link(l) { link.poller_ = true; }
    poller_turn(const poller_turn&) = delete;
    poller_turn& operator=(const poller_turn&) = delete;
    ~poller_turn() {
      link.poller_ = false;
      link.progressed_.notify_all();
    }
    rdma_link& link;
  };

  /// Spins, then sleeps, until `ready()` (called under `mutex_`); checks
  /// the peer's liveness every liveness_interval and `until` while it waits.
  template <class Ready>
  void wait(Ready&& ready, std::optional<deadline> until) {
    if (spin_until([&] { return attempt(ready); }, spin_budget))
      return;
    using clock = std::chrono::steady_clock;
    auto next_check = clock::now() + liveness_interval;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (look_locked(ready))
        return;
      auto now = clock::now();
      if (now >= next_check) {
        next_check = now + liveness_interval;
        if (socket_->peer_gone()) {
          lock.unlock();
          peer_gone(ready);
          return;
        }
      }
      auto slice =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_check - now);
      if (until) {
        if (now >= *until)
          throw transport_error(transport_errc::timeout,
                                "rdma peer " + peer_ + " sent nothing in time");
        slice = std::min(
          slice,
          std::chrono::duration_cast<std::chrono::milliseconds>(*until - now));
      }
      slice = std::max(slice, std::chrono::milliseconds(1));
      if (poller_) {
        progressed_.wait_for(lock, slice);
        continue;
      }
      poller_turn turn(*this);
      lock.unlock();
      // Arm, then look: a completion the look misses raises an event.
      ibv_req_notify_cq(cq_.get(), 0);
      lock.lock();
      if (look_locked(ready))
        return;
      lock.unlock();
      pollfd fds[2] = {{comp_->fd, POLLIN, 0}, {wake_.get(), POLLIN, 0}};
      ::poll(fds, 2, static_cast<int>(slice.count()));
      if ((fds[0].revents & POLLIN) != 0) {
        ibv_cq* cq = nullptr;
        void* context = nullptr;
        if (ibv_get_cq_event(comp_.get(), &cq, &context) == 0)
          ibv_ack_cq_events(cq, 1);
      }
      lock.lock();
    }
  }

  /// The bootstrap socket says the peer is gone. What it wrote before it
  /// went may complete just after its socket closed: look a little longer,
  /// then fail with peer_closed.
  template <class Ready>
  void peer_gone(Ready& ready) {
    auto grace = std::chrono::steady_clock::now() + 10ms;
    while (std::chrono::steady_clock::now() < grace) {
      if (attempt(ready))
        return;
      std::this_thread::sleep_for(1ms);
    }
    std::lock_guard<std::mutex> guard(mutex_);
    if (look_locked(ready))
      return;
    throw_failure_locked(transport_errc::peer_closed,
                         "rdma peer " + peer_ + " closed the channel");
  }

  // -- device memory ----------------------------------------------------------

  /// A memory region for `size` bytes at `data` when they are device
  /// memory that could be registered directly; nullptr for host memory.
  ibv_mr* device_region(const void* data, std::size_t size) {
#if H2_HAS_CUDA
    auto a = devices::find_cuda_allocation(data);
    if (!a)
      return nullptr;
    const auto begin = reinterpret_cast<std::uintptr_t>(data);
    if (auto it = device_mrs_.find(a->buffer_id); it != device_mrs_.end()) {
      ibv_mr* mr = it->second.get();
      if (mr != nullptr &&
          begin >= reinterpret_cast<std::uintptr_t>(mr->addr) &&
          begin + size <=
            reinterpret_cast<std::uintptr_t>(mr->addr) + mr->length)
        return mr;
      if (mr == nullptr)
        refuse_device_memory(data);
    }
    mr_ptr mr;
    if (auto buf = devices::export_cuda_dmabuf(*a)) {
      fd_guard fd(buf->fd); // the region keeps its own reference
      mr.reset(ibv_reg_dmabuf_mr(pd_.get(), 0, buf->bytes, buf->base, fd.get(),
                                 IBV_ACCESS_LOCAL_WRITE));
    }
    // Cached either way: an allocation that cannot be registered is not
    // tried again.
    ibv_mr* raw = mr.get();
    device_mrs_[a->buffer_id] = std::move(mr);
    if (raw == nullptr)
      refuse_device_memory(data);
    return raw;
#else
    (void)data;
    (void)size;
    return nullptr;
#endif
  }

  /// Device memory that cannot be registered cannot be staged either (the
  /// staging copy is a host memcpy): the caller must send it from host
  /// memory.
  [[noreturn]] void refuse_device_memory(const void* data) const {
    throw error("rdma: device memory at " +
                std::to_string(reinterpret_cast<std::uintptr_t>(data)) +
                " cannot be registered (no dma-buf export); copy it to host "
                "memory before sending");
  }

  // Declaration order is teardown order, reversed: memory regions go before
  // the queue pair, the queue pair before its completion queue, everything
  // before the protection domain, the id and its channel last.
  channel_ptr channel_;
  id_ptr id_;
  std::unique_ptr<socket_link> socket_; ///< kept open: tells peer death
  std::string peer_;
  std::uint64_t capacity_;
  pd_ptr pd_;
  comp_ptr comp_;
  cq_ptr cq_;
  qp_guard qp_;
  region in_ring_;
  mr_ptr in_mr_;
  region staging_;
  mr_ptr staging_mr_;
  ring_info remote_;
  std::uint64_t chunk_bytes_ = max_write_bytes;
  std::map<std::uint64_t, mr_ptr> device_mrs_; ///< by CUDA buffer id

  std::mutex mutex_; ///< the completion queue and everything below
  std::condition_variable progressed_;
  bool poller_ = false; ///< a waiter sleeps on the completion channel
  std::optional<ring::credit_writer> writer_;
  ring::credit_reader reader_;
  std::uint32_t sq_outstanding_ = 0;
  std::optional<transport_error> failure_;

  fd_guard wake_; ///< readable once shut down: wakes sleeping waits
  std::atomic<bool> shut_{false};
};

// -- the backend --------------------------------------------------------------

sockaddr_storage ip_address(const std::string& host, std::uint16_t port) {
  sockaddr_storage ss{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
  } else {
    throw config_error("transport.bind",
                       "\"" + host + "\" is not an IP address");
  }
  return ss;
}

class rdma_backend final : public backend {
public:
  explicit rdma_backend(const endpoint_options& options)
      : node_rank_(options.node_rank),
        bind_host_(options.bind_host),
        ring_bytes_(
          std::clamp(options.shm_ring_bytes, min_ring_bytes, max_ring_bytes)),
        bootstrap_(tcp::make_backend(options)) {}

  ~rdma_backend() override { stop(); }

  std::string_view name() const noexcept override { return "rdma"; }

  bool can_connect(const endpoint_address& a,
                   const endpoint_address& b) const override {
    return !a.rdma_device.empty() && !b.rdma_device.empty();
  }

  void start(
    endpoint_address& local,
    std::function<void(std::unique_ptr<byte_link>)> on_connection) override {
    auto probe = probe_devices();
    if (probe.devices.empty()) {
      why_unavailable_ = probe.why_none;
      return; // rdma_device stays empty: peers choose another backend
    }
    std::string device;
    try {
      device = listen(probe.devices.front());
    } catch (const transport_error& e) {
      why_unavailable_ = e.what();
      listen_id_.reset();
      listen_channel_.reset();
      return;
    }
    endpoint_address bootstrap;
    bootstrap_->start(bootstrap, std::move(on_connection));
    local.rdma_device = device;
    local.rdma_port = bootstrap.tcp_port;
    if (local.tcp_host.empty())
      local.tcp_host = bootstrap.tcp_host;
    listener_ = std::thread([this] { listen_loop(); });
  }

  std::unique_ptr<byte_link> connect(const endpoint_address& peer,
                                     deadline until) override {
    if (!listen_id_)
      throw config_error("transport.backend",
                         "node " + std::to_string(node_rank_) +
                           " has no RDMA device (" + why_unavailable_ + ")");
    endpoint_address bootstrap;
    bootstrap.tcp_host = peer.tcp_host;
    bootstrap.tcp_port = peer.rdma_port;
    try {
      return bootstrap_->connect(bootstrap, until);
    } catch (const transport_error& e) {
      throw transport_error(e.code(),
                            std::string("rdma bootstrap: ") + e.what());
    }
  }

  std::unique_ptr<byte_link> upgrade(std::unique_ptr<byte_link> bootstrap,
                                     bool acceptor, deadline until) override {
    auto* raw = dynamic_cast<socket_link*>(bootstrap.get());
    H2_ENFORCE(raw != nullptr, "the rdma bootstrap link is not a socket");
    bootstrap.release();
    std::unique_ptr<socket_link> socket(raw);
    return acceptor ? accept_link(std::move(socket), until)
                    : dial_link(std::move(socket), until);
  }

  void stop() noexcept override {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (stopped_)
        return;
      stopped_ = true;
    }
    arrived_.notify_all();
    bootstrap_->stop();
    if (listener_.joinable()) {
      std::uint64_t one = 1;
      (void)::write(stop_.get(), &one, sizeof(one));
      listener_.join();
    }
    listen_id_.reset();
    listen_channel_.reset();
  }

private:
  /// A dialer's connection request that an accepting upgrade waits for.
  struct slot {
    channel_ptr channel;
    id_ptr id;
  };

  /// Starts the rdma_cm listener on the bind address; returns the name of
  /// the device it is bound to (`fallback` for a wildcard or loopback bind,
  /// which accepts on whichever device a request arrives).
  std::string listen(const std::string& fallback) {
    listen_channel_.reset(new_event_channel());
    set_nonblocking(listen_channel_->fd);
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(listen_channel_.get(), &id, nullptr, RDMA_PS_TCP) != 0)
      fail_setup(errno_text("rdma_create_id"));
    listen_id_.reset(id);
    auto addr = ip_address(bind_host_, 0);
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)) != 0)
      fail_setup("cannot bind to " + bind_host_ + ": " +
                 errno_text("rdma_bind_addr"));
    if (rdma_listen(id, 128) != 0)
      fail_setup(errno_text("rdma_listen"));
    cm_port_ = ntohs(rdma_get_src_port(id));
    if (stop_.get() < 0)
      fail_setup(errno_text("eventfd"));
    if (id->verbs != nullptr)
      return ibv_get_device_name(id->verbs->device);
    return fallback;
  }

  /// Pairs incoming connection requests with waiting upgrades by token.
  void listen_loop() {
    for (;;) {
      pollfd fds[2] = {{listen_channel_->fd, POLLIN, 0},
                       {stop_.get(), POLLIN, 0}};
      ::poll(fds, 2, -1);
      {
        std::lock_guard<std::mutex> guard(mutex_);
        if (stopped_)
          return;
      }
      rdma_cm_event* ev = nullptr;
      while (rdma_get_cm_event(listen_channel_.get(), &ev) == 0) {
        if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
          // Events of requests not yet moved to their link's channel (a
          // dialer that gave up): their upgrade times out on its own.
          rdma_ack_cm_event(ev);
          continue;
        }
        std::optional<std::uint64_t> token;
        const auto* pd =
          static_cast<const std::byte*>(ev->param.conn.private_data);
        if (pd != nullptr &&
            ev->param.conn.private_data_len >= private_data_bytes &&
            get(pd, 4) == record_magic)
          token = get(pd + 8, 8);
        id_ptr id(ev->id);
        rdma_ack_cm_event(ev); // before migrating: it waits for acks
        hand_over(token, std::move(id));
      }
    }
  }

  void hand_over(std::optional<std::uint64_t> token, id_ptr id) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = token ? slots_.find(*token) : slots_.end();
    if (it == slots_.end() || it->second.id) {
      rdma_reject(id.get(), nullptr, 0); // unknown, late or repeated
      return;
    }
    // The link gets a channel of its own, so it outlives this listener.
    rdma_event_channel* ch = rdma_create_event_channel();
    if (ch == nullptr) {
      rdma_reject(id.get(), nullptr, 0);
      return;
    }
    channel_ptr channel(ch);
    const int flags = ::fcntl(ch->fd, F_GETFL, 0);
    if (rdma_migrate_id(id.get(), ch) != 0 || flags < 0 ||
        ::fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
      rdma_reject(id.get(), nullptr, 0);
      return;
    }
    it->second.channel = std::move(channel);
    it->second.id = std::move(id);
    arrived_.notify_all();
  }

  std::unique_ptr<byte_link> accept_link(std::unique_ptr<socket_link> socket,
                                         deadline until) {
    const std::uint64_t token = random_token();
    slot mine;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      slots_[token];
    }
    try {
      send_offer(*socket, {token, cm_port_});
      std::unique_lock<std::mutex> lock(mutex_);
      for (;;) {
        auto& s = slots_[token];
        if (s.id) {
          mine = std::move(s);
          break;
        }
        if (stopped_)
          throw transport_error(transport_errc::cancelled,
                                "rdma: the endpoint was stopped");
        if (std::chrono::steady_clock::now() >= until)
          throw transport_error(transport_errc::timeout,
                                "rdma: peer " + socket->peer() +
                                  " did not connect its queue pair in time");
        arrived_.wait_for(lock, liveness_interval);
        if (socket->peer_gone())
          throw transport_error(transport_errc::peer_closed,
                                "rdma: peer " + socket->peer() +
                                  " left before connecting its queue pair");
      }
      slots_.erase(token);
    } catch (...) {
      std::lock_guard<std::mutex> guard(mutex_);
      slots_.erase(token);
      throw;
    }
    auto link =
      std::make_unique<rdma_link>(std::move(mine.channel), std::move(mine.id),
                                  std::move(socket), ring_bytes_);
    rdma_conn_param param{};
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.rnr_retry_count = 7; // our accounting avoids RNR; never fatal
    if (rdma_accept(link->id(), &param) != 0)
      fail_setup(errno_text("rdma_accept"));
    expect_event(link->channel(), RDMA_CM_EVENT_ESTABLISHED, until,
                 "accepting " + link->peer());
    link->exchange_rings(until);
    return link;
  }

  std::unique_ptr<byte_link> dial_link(std::unique_ptr<socket_link> socket,
                                       deadline until) {
    const offer o = receive_offer(*socket, until);
    // The acceptor's rdma_cm listens where its bootstrap socket was reached.
    sockaddr_storage dst{};
    socklen_t len = sizeof(dst);
    if (::getpeername(socket->fd(), reinterpret_cast<sockaddr*>(&dst), &len) !=
        0)
      fail_setup(errno_text("getpeername"));
    if (dst.ss_family == AF_INET)
      reinterpret_cast<sockaddr_in*>(&dst)->sin_port = htons(o.cm_port);
    else if (dst.ss_family == AF_INET6)
      reinterpret_cast<sockaddr_in6*>(&dst)->sin6_port = htons(o.cm_port);
    else
      fail_setup("the bootstrap connection is not over IP");
    const std::string where = "connecting to " + socket->peer();
    channel_ptr channel(new_event_channel());
    set_nonblocking(channel->fd);
    rdma_cm_id* raw = nullptr;
    if (rdma_create_id(channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0)
      fail_setup(errno_text("rdma_create_id"));
    id_ptr id(raw);
    auto budget = [&] {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
      return static_cast<int>(
        std::clamp<long long>(left.count(), 1, resolve_timeout_ms));
    };
    if (rdma_resolve_addr(raw, nullptr, reinterpret_cast<sockaddr*>(&dst),
                          budget()) != 0)
      fail_setup(where + ": " + errno_text("rdma_resolve_addr"));
    expect_event(channel.get(), RDMA_CM_EVENT_ADDR_RESOLVED, until, where);
    if (rdma_resolve_route(raw, budget()) != 0)
      fail_setup(where + ": " + errno_text("rdma_resolve_route"));
    expect_event(channel.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, until, where);
    auto link = std::make_unique<rdma_link>(std::move(channel), std::move(id),
                                            std::move(socket), ring_bytes_);
    std::byte private_data[private_data_bytes] = {};
    put(private_data, record_magic, 4);
    put(private_data + 8, o.token, 8);
    rdma_conn_param param{};
    param.private_data = private_data;
    param.private_data_len = sizeof(private_data);
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    if (rdma_connect(link->id(), &param) != 0)
      fail_setup(where + ": " + errno_text("rdma_connect"));
    expect_event(link->channel(), RDMA_CM_EVENT_ESTABLISHED, until, where);
    link->exchange_rings(until);
    return link;
  }

  std::int32_t node_rank_;
  std::string bind_host_;
  std::uint64_t ring_bytes_;
  /// The bootstrap listener and dialer: the tcp backend's, reused.
  std::unique_ptr<backend> bootstrap_;
  std::string why_unavailable_ = "not started";
  channel_ptr listen_channel_;
  id_ptr listen_id_;
  std::uint16_t cm_port_ = 0;
  fd_guard stop_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::thread listener_;

  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::uint64_t, slot> slots_; ///< by token
  bool stopped_ = false;
};

} // namespace

device_probe probe_devices() noexcept {
  device_probe out;
  try {
    errno = 0;
    int count = 0;
    ibv_device** list = ibv_get_device_list(&count);
    if (list == nullptr) {
      out.why_none = errno_text("ibv_get_device_list");
      return out;
    }
    std::string trouble;
    for (int i = 0; i < count; ++i) {
      const char* name = ibv_get_device_name(list[i]);
      ibv_context* ctx = ibv_open_device(list[i]);
      if (ctx == nullptr) {
        trouble = std::string(name) + ": " + errno_text("ibv_open_device");
        continue;
      }
      ibv_device_attr attr{};
      bool active = false;
      if (ibv_query_device(ctx, &attr) == 0)
        for (int port = 1; port <= attr.phys_port_cnt && !active; ++port) {
          ibv_port_attr pa{};
          active =
            ibv_query_port(ctx, static_cast<std::uint8_t>(port), &pa) == 0 &&
            pa.state == IBV_PORT_ACTIVE;
        }
      ibv_close_device(ctx);
      if (active)
        out.devices.emplace_back(name);
      else if (trouble.empty())
        trouble = std::string(name) + " has no active port";
    }
    ibv_free_device_list(list);
    if (out.devices.empty())
      out.why_none =
        count == 0 ? std::string("ibv_get_device_list: no devices") : trouble;
  } catch (...) {
    out.devices.clear();
    out.why_none = "out of memory probing RDMA devices";
  }
  return out;
}

std::unique_ptr<backend> make_backend(const endpoint_options& options) {
  return std::make_unique<rdma_backend>(options);
}

} // namespace h2::transport::rdma
