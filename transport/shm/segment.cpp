#include "segment.hpp"

#include "h2/core/error.hpp"

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <linux/futex.h>
#include <poll.h>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace h2::transport::shm {

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

void signal(std::atomic<std::uint32_t>& seq) noexcept {
  seq.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&seq);
}

segment::~segment() {
  if (map != nullptr)
    ::munmap(map, bytes);
}

namespace {

/// A message of `sizes` with room for one descriptor: what send_fd() sends
/// and receive_fd() receives. Points into itself: neither copied nor moved.
struct fd_message {
  explicit fd_message(segment_sizes& sizes) : iov{&sizes, sizeof(sizes)} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  fd_message(const fd_message&) = delete;
  fd_message& operator=(const fd_message&) = delete;

  iovec iov;
  msghdr msg{};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
};

} // namespace

void send_fd(int socket, int fd, segment_sizes sizes) {
  fd_message m(sizes);
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (::sendmsg(socket, &m.msg, MSG_NOSIGNAL) != sizeof(sizes))
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
  fd_message m(sizes);
  ssize_t n = ::recvmsg(socket, &m.msg, MSG_CMSG_CLOEXEC);
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
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

} // namespace h2::transport::shm
