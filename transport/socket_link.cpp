#include "h2/transport/socket_link.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/wake_fd.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace h2::transport {

socket_link::socket_link(int fd, std::string backend, std::string peer)
  : fd_(fd), backend_(std::move(backend)), peer_(std::move(peer)) {
  // Sockets that went through Asio's asynchronous connect are left
  // non-blocking; this link's writes block (its reads never wait:
  // MSG_DONTWAIT, and waits poll).
  int flags = ::fcntl(fd_, F_GETFL, 0);
  if (flags >= 0 && (flags & O_NONBLOCK) != 0)
    ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
}

socket_link::~socket_link() {
  shutdown();
  ::close(fd_);
  for (int f : {receive_.wake_fd, drain_.wake_fd})
    if (f >= 0)
      ::close(f);
}

void socket_link::make_wake_fds() {
  std::call_once(wake_fds_made_, [this] {
    const int a = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    const int b = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (a < 0 || b < 0) {
      const int err = errno;
      for (int f : {a, b})
        if (f >= 0)
          ::close(f);
      // Thrown out of call_once: the next wait tries again.
      throw transport_error(transport_errc::peer_closed,
                            backend_ + " link to " + peer_ +
                              ": eventfd: " + std::strerror(err));
    }
    receive_.wake_fd = a;
    drain_.wake_fd = b;
  });
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

void socket_link::write(std::initializer_list<buffer_view> parts,
                        deadline until) {
  std::vector<iovec> iov;
  for (const auto& p : parts)
    if (p.size != 0)
      iov.push_back({const_cast<void*>(p.data), p.size});
  std::size_t at = 0;
  while (at < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + at;
    msg.msg_iovlen = std::min<std::size_t>(iov.size() - at, IOV_MAX);
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        fail(errno, "send");
      // The socket's buffer is full: wait for room, up to the deadline.
      const auto now = std::chrono::steady_clock::now();
      if (now >= until)
        throw transport_error(transport_errc::timeout,
                              backend_ + " peer " + peer_ +
                                " took no bytes in time");
      const auto left = std::min<std::chrono::nanoseconds>(
        until - now, std::chrono::milliseconds(100));
      timespec ts{static_cast<time_t>(left.count() / 1000000000),
                  static_cast<long>(left.count() % 1000000000)};
      pollfd pfd{fd_, POLLOUT, 0};
      if (::ppoll(&pfd, 1, &ts, nullptr) < 0 && errno != EINTR)
        fail(errno, "poll");
      if (shut_.load())
        fail(0, "send");
      continue;
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

std::size_t socket_link::read_some(void* data, std::size_t size) {
  if (size == 0)
    return 0; // recv(2) would answer 0, as for the stream's end
  for (;;) {
    const ssize_t n = ::recv(fd_, data, size, MSG_DONTWAIT);
    if (n > 0)
      return static_cast<std::size_t>(n);
    if (n == 0)
      fail(0, "end of stream");
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (shut_.load())
        fail(0, "receive");
      return 0;
    }
    fail(errno, "receive");
  }
}

std::uint32_t socket_link::wake_count() const noexcept {
  return wakes_.load(std::memory_order_seq_cst);
}

void socket_link::wait_readable(std::uint32_t seen, deadline until) {
  if (!sleep(receive_, seen, until))
    throw transport_error(transport_errc::timeout, backend_ + " peer " + peer_ +
                                                     " sent nothing in time");
}

void socket_link::wait_drain(std::uint32_t seen) {
  (void)sleep(drain_, seen, std::chrono::steady_clock::now() + drain_interval);
}

void socket_link::nudge() noexcept {
  wakes_.fetch_add(1, std::memory_order_seq_cst);
  // Counted before a sleeper's last look at wakes_ (Dekker): one that is
  // not counted yet will see the new count.
  for (sleep_place* place : {&receive_, &drain_})
    if (place->sleeping.load(std::memory_order_seq_cst) != 0)
      wake(place->wake_fd);
}

bool socket_link::sleep(sleep_place& place, std::uint32_t seen,
                        deadline until) {
  // Before the count: nudge() writes the descriptor of a counted sleeper.
  make_wake_fds();
  struct counted {
    std::atomic<int>& n;
    explicit counted(std::atomic<int>& c) : n(c) {
      n.fetch_add(1, std::memory_order_seq_cst);
    }
    ~counted() { n.fetch_sub(1, std::memory_order_seq_cst); }
  } in_place(place.sleeping);
  for (;;) {
    if (shut_.load())
      fail(0, "receive");
    if (wakes_.load(std::memory_order_seq_cst) != seen)
      return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= until)
      return false;
    // A day at most per poll: far deadlines ("wait") fit a timespec.
    const auto left =
      std::min<std::chrono::nanoseconds>(until - now, std::chrono::hours(24));
    timespec ts{static_cast<time_t>(left.count() / 1000000000),
                static_cast<long>(left.count() % 1000000000)};
    pollfd fds[2] = {{fd_, POLLIN, 0}, {place.wake_fd, POLLIN, 0}};
    if (::ppoll(fds, 2, &ts, nullptr) < 0) {
      if (errno == EINTR)
        continue;
      fail(errno, "poll");
    }
    if (fds[1].revents != 0) {
      // Emptied before the count is looked at again: a later nudge()
      // writes it anew.
      drain_wakes(place.wake_fd);
      continue;
    }
    if (fds[0].revents != 0)
      return true;
  }
}

void socket_link::shutdown() noexcept {
  if (!shut_.exchange(true)) {
    ::shutdown(fd_, SHUT_RDWR);
    nudge(); // sleepers look at shut_ again
  }
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

socket_listener::~socket_listener() {
  stop();
}

void socket_listener::start(make_link make, on_connection deliver,
                            std::string what, log_sink log) {
  thread_ =
    std::thread([this, make = std::move(make), deliver = std::move(deliver),
                 what = std::move(what),
                 report = std::make_shared<throttled_report>(std::move(log))] {
      for (;;) {
        int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (stopped_.load()) {
          if (fd >= 0)
            ::close(fd);
          return;
        }
        if (fd >= 0) {
          try {
            if (auto link = make(fd))
              deliver(std::move(link));
            continue;
          } catch (const std::exception& e) {
            // The link could not be set up (no descriptor or memory left for
            // its own use): the connection is dropped, its dialer sees it
            // closed. Nothing may escape this thread.
            (*report)(what + ": dropped a connection: " + e.what());
          }
          failed_.fetch_add(1);
          std::this_thread::sleep_for(retry_delay);
          continue;
        }
        const int err = errno;
        if (err == EINTR || err == ECONNABORTED)
          continue; // a signal, or a peer that gave up while queued
        if (err == EBADF || err == EINVAL || err == ENOTSOCK)
          return; // the listener itself is gone
        // Out of descriptors (EMFILE, ENFILE) or memory: the condition lasts
        // a while, and retrying at once would spin a core on it.
        (*report)(what + ": cannot accept: " + std::strerror(err) +
                  "; retrying every " + std::to_string(retry_delay.count()) +
                  " ms");
        failed_.fetch_add(1);
        std::this_thread::sleep_for(retry_delay);
      }
    });
}

void socket_listener::stop() noexcept {
  if (stopped_.exchange(true))
    return;
  if (fd_ >= 0)
    ::shutdown(fd_, SHUT_RDWR); // wakes the blocking accept
  if (thread_.joinable())
    thread_.join();
  if (fd_ >= 0)
    ::close(fd_);
  fd_ = -1;
}

} // namespace h2::transport
