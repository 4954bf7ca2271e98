#include "h2/transport/shm/channel.hpp"

#include "h2/transport/ring.hpp"
#include "h2/transport/socket_link.hpp"
#include "h2/transport/spin.hpp"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <linux/futex.h>
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
                std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>((timeout.count() % 1000) * 1000000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT,
            expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE,
            INT_MAX, nullptr, nullptr, 0);
}

// -- the segment --------------------------------------------------------------

/// One direction. Head and tail count bytes since the start; the writer owns
/// head, the reader tail. A waiting side sets its flag and sleeps on a
/// sequence word the other side bumps after it moves (an eventcount).
struct ring_control {
  alignas(64) std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
  alignas(64) std::atomic<std::uint32_t> data_seq{0};
  std::atomic<std::uint32_t> reader_waiting{0};
  alignas(64) std::atomic<std::uint32_t> space_seq{0};
  std::atomic<std::uint32_t> writer_waiting{0};
  alignas(64) std::atomic<std::uint32_t> writer_closed{0};
  std::atomic<std::uint32_t> reader_closed{0};
};

constexpr std::uint64_t segment_magic = 0x6d68735f4432480aULL;
constexpr std::size_t control_bytes = 4096;

struct segment_header {
  std::uint64_t magic;
  std::uint64_t capacity; ///< bytes of each ring
  ring_control rings[2];  ///< [0]: acceptor -> dialer, [1]: dialer -> acceptor
};
static_assert(sizeof(segment_header) <= control_bytes);

/// How long a sleeping side waits before it checks that its peer lives.
constexpr std::chrono::milliseconds liveness_interval{20};
/// How long a side spins before it sleeps.
constexpr std::chrono::microseconds spin_wanted{50};

class shm_link final : public byte_link {
public:
  shm_link(void* map, std::size_t map_bytes, bool acceptor,
           std::unique_ptr<socket_link> socket)
      : map_(map), map_bytes_(map_bytes), socket_(std::move(socket)) {
    auto* h = static_cast<segment_header*>(map);
    capacity_ = h->capacity;
    auto* base = static_cast<char*>(map) + control_bytes;
    out_ = &h->rings[acceptor ? 0 : 1];
    in_ = &h->rings[acceptor ? 1 : 0];
    out_data_ = base + (acceptor ? 0 : capacity_);
    in_data_ = base + (acceptor ? capacity_ : 0);
  }

  ~shm_link() override {
    shutdown();
    ::munmap(map_, map_bytes_);
  }

  void write(std::initializer_list<buffer_view> parts) override {
    for (const auto& part : parts) {
      const char* p = static_cast<const char*>(part.data);
      std::size_t left = part.size;
      while (left > 0) {
        std::uint64_t head = out_->head.load(std::memory_order_relaxed);
        std::uint64_t free_bytes = 0;
        wait(
          [&] {
            if (out_->reader_closed.load(std::memory_order_acquire) != 0)
              throw transport_error(transport_errc::peer_closed,
                                    "shm peer " + peer() +
                                      " closed the channel");
            free_bytes = ring::free_space(
              head, out_->tail.load(std::memory_order_acquire), capacity_);
            return free_bytes > 0;
          },
          out_->space_seq, out_->writer_waiting, std::nullopt);
        std::size_t n = std::min<std::uint64_t>(free_bytes, left);
        ring::copy_in(out_data_, capacity_, head, p, n);
        out_->head.store(head + n, std::memory_order_seq_cst);
        if (out_->reader_waiting.load(std::memory_order_seq_cst) != 0) {
          out_->data_seq.fetch_add(1, std::memory_order_seq_cst);
          futex_wake(&out_->data_seq);
        }
        p += n;
        left -= n;
      }
    }
  }

  void read(void* data, std::size_t size,
            std::optional<deadline> until) override {
    char* p = static_cast<char*>(data);
    const char* start = p;
    while (size > 0) {
      std::uint64_t tail = in_->tail.load(std::memory_order_relaxed);
      std::uint64_t available = 0;
      wait(
        [&] {
          available =
            ring::used(in_->head.load(std::memory_order_acquire), tail);
          if (available == 0 &&
              in_->writer_closed.load(std::memory_order_acquire) != 0) {
            if (p != start)
              throw transport_error(transport_errc::corrupt_frame,
                                    "corrupt frame: shm peer ended the stream "
                                    "inside a frame");
            throw transport_error(transport_errc::peer_closed,
                                  "shm peer " + peer() + " closed the channel");
          }
          return available > 0;
        },
        in_->data_seq, in_->reader_waiting, until);
      std::size_t n = std::min<std::uint64_t>(available, size);
      ring::copy_out(in_data_, capacity_, tail, p, n);
      in_->tail.store(tail + n, std::memory_order_seq_cst);
      if (in_->writer_waiting.load(std::memory_order_seq_cst) != 0) {
        in_->space_seq.fetch_add(1, std::memory_order_seq_cst);
        futex_wake(&in_->space_seq);
      }
      p += n;
      size -= n;
    }
  }

  void shutdown() noexcept override {
    if (shut_.exchange(true))
      return;
    out_->writer_closed.store(1, std::memory_order_seq_cst);
    in_->reader_closed.store(1, std::memory_order_seq_cst);
    for (auto* w :
         {&out_->data_seq, &out_->space_seq, &in_->data_seq, &in_->space_seq}) {
      w->fetch_add(1, std::memory_order_seq_cst);
      futex_wake(w);
    }
    socket_->shutdown();
  }

  std::string_view backend() const noexcept override { return "shm"; }
  std::string peer() const override { return "(same host)"; }

private:
  /// Spins, then sleeps on `seq` with `flag` raised, until `ready()`; checks
  /// this end's shutdown, the peer's liveness and `until` while it waits.
  template <class Ready>
  void wait(Ready&& ready, std::atomic<std::uint32_t>& seq,
            std::atomic<std::uint32_t>& flag, std::optional<deadline> until) {
    if (spin_until([&] { return check_shut(), ready(); },
                   spin_budget(spin_wanted)))
      return;
    for (;;) {
      std::uint32_t seen = seq.load(std::memory_order_seq_cst);
      flag.store(1, std::memory_order_seq_cst);
      check_shut();
      if (ready()) {
        flag.store(0, std::memory_order_relaxed);
        return;
      }
      auto slice = liveness_interval;
      if (until) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          *until - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
          flag.store(0, std::memory_order_relaxed);
          throw transport_error(transport_errc::timeout,
                                "shm peer sent nothing in time");
        }
        slice = std::min(slice, left);
      }
      futex_wait(&seq, seen, slice);
      flag.store(0, std::memory_order_relaxed);
      if (ready())
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

  void* map_;
  std::size_t map_bytes_;
  std::unique_ptr<socket_link> socket_; ///< kept open: tells peer death
  std::uint64_t capacity_ = 0;
  ring_control* out_;
  ring_control* in_;
  char* out_data_;
  char* in_data_;
  std::atomic<bool> shut_{false};
};

// -- fd passing
// -------------------------------------------------------------------

void send_fd(int socket, int fd, std::uint64_t capacity) {
  msghdr msg{};
  iovec iov{&capacity, sizeof(capacity)};
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
  if (::sendmsg(socket, &msg, MSG_NOSIGNAL) != sizeof(capacity))
    throw transport_error(transport_errc::peer_closed,
                          std::string("shm: cannot pass the segment: ") +
                            std::strerror(errno));
}

int receive_fd(int socket, std::uint64_t& capacity, deadline until) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
    until - std::chrono::steady_clock::now());
  pollfd pfd{socket, POLLIN, 0};
  if (::poll(&pfd, 1, static_cast<int>(std::max<long long>(0, left.count()))) <=
      0)
    throw transport_error(transport_errc::timeout,
                          "shm: the segment did not arrive in time");
  msghdr msg{};
  iovec iov{&capacity, sizeof(capacity)};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (n != sizeof(capacity) || c == nullptr || c->cmsg_type != SCM_RIGHTS)
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
      : ring_bytes_(options.shm_ring_bytes) {}

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
    std::uint64_t capacity = ring_bytes_;
    int fd = -1;
    if (acceptor) {
      fd = ::memfd_create("h2-shm", MFD_CLOEXEC);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(control_bytes +
                                                       2 * capacity)) != 0)
        throw transport_error(transport_errc::peer_closed,
                              std::string("shm: cannot create a segment: ") +
                                std::strerror(errno));
    } else {
      fd = receive_fd(socket->fd(), capacity, until);
      if (capacity == 0 || capacity > (std::uint64_t{1} << 40)) {
        ::close(fd);
        throw transport_error(transport_errc::corrupt_frame,
                              "shm: the peer's segment is malformed");
      }
    }
    const std::size_t bytes = control_bytes + 2 * capacity;
    void* map = nullptr;
    try {
      map = map_segment(fd, bytes);
      if (acceptor) {
        auto* h = new (map) segment_header{segment_magic, capacity, {}};
        (void)h;
        send_fd(socket->fd(), fd, capacity);
      } else if (static_cast<segment_header*>(map)->magic != segment_magic ||
                 static_cast<segment_header*>(map)->capacity != capacity) {
        throw transport_error(transport_errc::corrupt_frame,
                              "shm: the peer's segment is malformed");
      }
    } catch (...) {
      if (map != nullptr)
        ::munmap(map, bytes);
      ::close(fd);
      throw;
    }
    // The mapping keeps the segment alive; the descriptor is not needed.
    ::close(fd);
    return std::make_unique<shm_link>(map, bytes, acceptor, std::move(socket));
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
  std::uint64_t ring_bytes_;
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
