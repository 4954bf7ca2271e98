// socket_listener (socket_link.hpp), the accept loop of tcp and shm: a
// failed accept such as EMFILE is retried after a pause, never in a spin,
// and the listener recovers once descriptors are free again.
#include "h2/transport/socket_link.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <ctime>
#include <mutex>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

std::chrono::nanoseconds process_cpu_time() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
}

/// A TCP socket listening on 127.0.0.1, at a port the kernel chose.
struct loopback_socket {
  int fd = -1;
  sockaddr_storage address{}; ///< with the chosen port
  socklen_t address_bytes = 0;
};

/// Opens, binds and listens `s` (fatal test failures when it cannot: call
/// in ASSERT_NO_FATAL_FAILURE).
void listen_on_loopback(loopback_socket& s) {
  s.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s.fd, 0);
  s.address = ip_address("127.0.0.1", 0);
  ASSERT_EQ(
    ::bind(s.fd, reinterpret_cast<sockaddr*>(&s.address), sizeof(sockaddr_in)),
    0);
  ASSERT_EQ(::listen(s.fd, 16), 0);
  s.address_bytes = sizeof(s.address);
  ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&s.address),
                &s.address_bytes);
}

TEST(transport_socket_listener, out_of_descriptors_pauses_then_recovers) {
  loopback_socket s;
  ASSERT_NO_FATAL_FAILURE(listen_on_loopback(s));
  auto* ss = reinterpret_cast<sockaddr*>(&s.address);

  std::mutex mutex;
  std::vector<std::unique_ptr<byte_link>> links;
  socket_listener listener(s.fd);
  listener.start(
    [](int accepted) {
      return std::make_unique<socket_link>(accepted, "tcp", "test");
    },
    [&](std::unique_ptr<byte_link> link) {
      std::lock_guard<std::mutex> guard(mutex);
      links.push_back(std::move(link));
    });
  auto accepted = [&] {
    std::lock_guard<std::mutex> guard(mutex);
    return links.size();
  };
  // Clients' sockets are made while descriptors are still there.
  int clients[2] = {::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0),
                    ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  ASSERT_GE(clients[0], 0);
  ASSERT_GE(clients[1], 0);
  std::this_thread::sleep_for(50ms); // the listener is blocked in accept
  {
    // UBSan's first check of a socket_link's vptr probes memory through a
    // pipe, which fails without descriptors: have it look while there are.
    int pair[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    std::unique_ptr<byte_link> warm =
      std::make_unique<socket_link>(pair[0], "tcp", "warm-up");
    EXPECT_EQ(warm->backend(), "tcp");
    std::vector<std::unique_ptr<byte_link>> kept;
    kept.push_back(std::move(warm));
    ::close(pair[1]);
  }

  // No descriptor may be opened from here on: every accept but one that
  // already waited (the kernel reserves its descriptor first) fails with
  // EMFILE.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit none = old;
  none.rlim_cur = 0;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &none), 0);
  const bool first_connected = ::connect(clients[0], ss, s.address_bytes) == 0;
  const auto cpu_before = process_cpu_time();
  std::this_thread::sleep_for(400ms);
  const auto cpu = process_cpu_time() - cpu_before;
  const bool second_connected = ::connect(clients[1], ss, s.address_bytes) == 0;
  const std::uint64_t failed = listener.failed_accepts();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);

  EXPECT_TRUE(first_connected);
  EXPECT_TRUE(second_connected);
  // A spinning loop burns the 400 ms on a core; a pausing one retries
  // about every socket_listener::retry_delay.
  EXPECT_GE(failed, 1u);
  EXPECT_LE(failed, 400ms / socket_listener::retry_delay + 2);
  EXPECT_LT(cpu, 100ms) << "the accept loop spun while out of descriptors";

  // Descriptors are back: both connections are accepted.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (accepted() < 2 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(accepted(), 2u);
  listener.stop();
  ::close(clients[0]);
  ::close(clients[1]);
}

TEST(transport_socket_listener, stop_ends_a_blocked_accept) {
  loopback_socket s;
  ASSERT_NO_FATAL_FAILURE(listen_on_loopback(s));
  socket_listener listener(s.fd);
  listener.start(
    [](int a) { return std::make_unique<socket_link>(a, "tcp", "t"); },
    [](std::unique_ptr<byte_link>) {});
  std::this_thread::sleep_for(20ms);
  const auto start = std::chrono::steady_clock::now();
  listener.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  EXPECT_EQ(listener.failed_accepts(), 0u);
}

} // namespace
} // namespace h2::transport
