#include "h2/transport/shm/backend.hpp"

#include "link.hpp"
#include "segment.hpp"

#include "h2/core/error.hpp"
#include "h2/core/random.hpp"
#include "h2/transport/socket_link.hpp"

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fcntl.h>
#include <new>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

#include <algorithm>

namespace h2::transport::shm {

namespace {

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

/// Why segment `fd` that a peer passed with `sizes` cannot be mapped
/// safely ("" when it can): sizes this backend would not make, a size
/// other than they claim, or no seals against shrinking and growing.
std::string check_peer_segment(int fd, const segment_sizes& sizes) {
  if (!sizes.valid())
    return "is malformed";
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return std::string("cannot be examined: ") + std::strerror(errno);
  if (static_cast<std::uint64_t>(st.st_size) != sizes.total())
    return "holds " + std::to_string(st.st_size) + " bytes, not the " +
           std::to_string(sizes.total()) + " it claims";
  const int seals = ::fcntl(fd, F_GET_SEALS);
  constexpr int needed = F_SEAL_SHRINK | F_SEAL_GROW;
  if (seals < 0 || (seals & needed) != needed)
    return "is not sealed against resizing";
  return "";
}

class shm_backend final : public backend {
public:
  explicit shm_backend(const endpoint_options& options)
      : sizes_{options.shm_ring_bytes,
               options.shm_heap_bytes / block_alignment * block_alignment},
        log_(options.log) {
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

  void start(
    endpoint_address& local,
    std::function<void(std::unique_ptr<byte_link>)> on_connection) override {
    name_ = "h2-shm-" + std::to_string(::getpid()) + "-" + random_hex(8);
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = 0;
    auto addr = abstract_address(name_, len);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(fd, SOMAXCONN) != 0) {
      const int err = errno;
      if (fd >= 0)
        ::close(fd);
      throw bind_error("shm", "unix:@" + name_, err);
    }
    listener_ = std::make_unique<socket_listener>(fd);
    local.shm_socket = name_;
    auto refusal = std::make_shared<throttled_report>(log_);
    listener_->start(
      [refusal](int accepted) -> std::unique_ptr<byte_link> {
        // The abstract socket is open to every user of the host: a peer of
        // another user is closed before it can send a byte's worth of work.
        ucred cred{};
        socklen_t len = sizeof(cred);
        if (::getsockopt(accepted, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
            cred.uid != ::geteuid()) {
          (*refusal)("shm: refused a connection from uid " +
                     std::to_string(cred.uid) + " (pid " +
                     std::to_string(cred.pid) + "): not this job's user");
          ::close(accepted);
          return nullptr;
        }
        return std::make_unique<socket_link>(accepted, "shm",
                                             "pid " + std::to_string(cred.pid));
      },
      std::move(on_connection), "shm unix:@" + name_, log_);
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
      // Sealed at its size: the dialer refuses a segment that could still
      // shrink under its mapping (a SIGBUS) or grow.
      fd = ::memfd_create("h2-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(sizes.total())) != 0 ||
          ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
            0) {
        const int err = errno;
        if (fd >= 0)
          ::close(fd);
        throw transport_error(transport_errc::peer_closed,
                              std::string("shm: cannot create a segment: ") +
                                std::strerror(err));
      }
    } else {
      fd = receive_fd(socket->fd(), sizes, until);
      if (auto why = check_peer_segment(fd, sizes); !why.empty()) {
        ::close(fd);
        throw transport_error(transport_errc::corrupt_frame,
                              "shm: the peer's segment " + why);
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
                                      std::move(socket), log_);
  }

  void stop() noexcept override {
    if (listener_)
      listener_->stop();
  }

private:
  segment_sizes sizes_;
  log_sink log_;
  std::string name_;
  std::unique_ptr<socket_listener> listener_;
};

} // namespace

std::unique_ptr<backend> make_backend(const endpoint_options& options) {
  return std::make_unique<shm_backend>(options);
}

} // namespace h2::transport::shm
