#include "h2/transport/socket_link.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <vector>

namespace h2::transport {

socket_link::socket_link(int fd, std::string backend, std::string peer)
  : fd_(fd), backend_(std::move(backend)), peer_(std::move(peer)) {
  // Sockets that went through Asio's asynchronous connect are left
  // non-blocking; this link blocks (and polls for deadlines).
  int flags = ::fcntl(fd_, F_GETFL, 0);
  if (flags >= 0 && (flags & O_NONBLOCK) != 0)
    ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
}

socket_link::~socket_link() {
  shutdown();
  ::close(fd_);
}

void socket_link::fail(int err, const char* what) const {
  if (shut_.load())
    throw transport_error(transport_errc::cancelled,
                          backend_ + " link to " + peer_ + " was closed");
  if (err == 0 || err == EPIPE || err == ECONNRESET || err == ENOTCONN ||
      err == ECONNABORTED)
    throw transport_error(transport_errc::peer_closed,
                          backend_ + " peer " + peer_ + " closed the " +
                            "connection (" + what + ")");
  throw transport_error(transport_errc::peer_closed,
                        backend_ + " link to " + peer_ + ": " + what + ": " +
                          std::strerror(err));
}

void socket_link::write(std::initializer_list<buffer_view> parts) {
  std::vector<iovec> iov;
  for (const auto& p : parts)
    if (p.size != 0)
      iov.push_back({const_cast<void*>(p.data), p.size});
  std::size_t at = 0;
  while (at < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + at;
    msg.msg_iovlen = std::min<std::size_t>(iov.size() - at, IOV_MAX);
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      fail(errno, "send");
    }
    if (shut_.load())
      fail(0, "send");
    auto left = static_cast<std::size_t>(n);
    while (at < iov.size() && left >= iov[at].iov_len) {
      left -= iov[at].iov_len;
      ++at;
    }
    if (left > 0) {
      iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + left;
      iov[at].iov_len -= left;
    }
  }
}

void socket_link::read(void* data, std::size_t size,
                       std::optional<deadline> until) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    if (until) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        *until - std::chrono::steady_clock::now());
      pollfd pfd{fd_, POLLIN, 0};
      int rc = ::poll(&pfd, 1,
                      static_cast<int>(std::max<long long>(0, left.count())));
      if (rc < 0 && errno == EINTR)
        continue;
      if (rc == 0)
        throw transport_error(transport_errc::timeout,
                              backend_ + " peer " + peer_ +
                                " sent nothing in time");
    }
    ssize_t n = ::recv(fd_, p, size, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      fail(errno, "receive");
    }
    if (n == 0) {
      if (p != static_cast<char*>(data) && !shut_.load())
        throw transport_error(transport_errc::corrupt_frame,
                              "corrupt frame: " + backend_ + " peer " + peer_ +
                                " ended the stream inside a frame");
      fail(0, "end of stream");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void socket_link::shutdown() noexcept {
  if (!shut_.exchange(true))
    ::shutdown(fd_, SHUT_RDWR);
}

bool socket_link::peer_gone() const noexcept {
  pollfd pfd{fd_, POLLIN, 0};
  if (::poll(&pfd, 1, 0) <= 0)
    return false;
  if ((pfd.revents & (POLLHUP | POLLERR)) != 0)
    return true;
  char c;
  return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

std::string describe_peer(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    std::string out = "[";
    out.append(host).append("]:").append(std::to_string(ntohs(a->sin6_port)));
    return out;
  }
  if (ss.ss_family == AF_UNIX)
    return "unix socket";
  return "?";
}

} // namespace h2::transport
