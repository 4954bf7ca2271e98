// An endpoint's listeners under connections that never speak, and the
// bounds that hold them (docs/transport.md, Bounds): a fixed number of
// handshakes in progress, each for at most handshake_timeout, the oldest
// silent one cut off for a newcomer, a peer of another user refused by the
// shm listener before anything else; and the throttled report of it all.
#include "pairs.hpp"
#include "process_status.hpp"

#include "h2/transport/report.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

/// A connected socket to `e`'s listener of `backend`, or -1.
int open_silent(const endpoint& e, const std::string& backend) {
  const auto& addr = e.address();
  if (backend == "tcp") {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(addr.tcp_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 &&
        ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0)
      return fd;
    if (fd >= 0)
      ::close(fd);
    return -1;
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, addr.shm_socket.data(), addr.shm_socket.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                    addr.shm_socket.size());
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0)
    return fd;
  if (fd >= 0)
    ::close(fd);
  return -1;
}

/// Raises this process's descriptor limit to `want` (or the hard limit).
rlim_t raise_descriptor_limit(rlim_t want) {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = std::min(want, r.rlim_max);
  ::setrlimit(RLIMIT_NOFILE, &r);
  ::getrlimit(RLIMIT_NOFILE, &r);
  return r.rlim_cur;
}

using test::eventually;

class transport_flood : public ::testing::TestWithParam<std::string> {};

TEST_P(transport_flood, listener_survives_a_flood_of_silent_connections) {
  constexpr int flood = 4000;
  ASSERT_GE(raise_descriptor_limit(flood + 2000), rlim_t{flood + 500})
    << "the test needs descriptors for its flood";
  auto options = [&](int rank) {
    auto o = test::options_for(rank, GetParam());
    o.handshake_timeout = 30s; // no silent connection times out: all count
    return o;
  };
  endpoint a(options(0));
  endpoint b(options(1));
  // Training goes on over a channel connected before the flood.
  auto [from, to] = test::connect(a, b, GetParam(), 7);
  const int before = h2::test::threads_of(::getpid());

  std::atomic<bool> flooding{true};
  std::atomic<int> most_threads{before};
  std::thread watcher([&] {
    while (flooding.load()) {
      int n = h2::test::threads_of(::getpid());
      int seen = most_threads.load();
      while (n > seen && !most_threads.compare_exchange_weak(seen, n)) {
      }
      std::this_thread::sleep_for(1ms);
    }
  });
  std::thread trainer([&, &from = from] {
    for (int i = 0; flooding.load() || i < 100; ++i) {
      from->send(test::bytes_message(5, std::to_string(i)));
      std::this_thread::sleep_for(1ms);
    }
    from->send(test::bytes_message(5, "end"));
  });
  int received = 0;
  std::thread receiver([&, &to = to] {
    for (;;) {
      auto text = test::text_of(to->recv(5, 60s));
      if (text == "end")
        return;
      EXPECT_EQ(text, std::to_string(received));
      ++received;
    }
  });

  std::vector<int> silent;
  silent.reserve(flood);
  for (int i = 0; i < flood; ++i) {
    int fd = open_silent(b, GetParam());
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    silent.push_back(fd);
  }
  // Every connection was accepted: all but the last 64 were cut off.
  EXPECT_TRUE(eventually([&] {
    return b.refused() >= flood - b.pending_handshakes() - 1 &&
           b.pending_handshakes() <= 64;
  }))
    << "refused " << b.refused() << ", pending " << b.pending_handshakes();
  // A dialer with the secret still gets through, and training went on.
  auto [late_from, late_to] = test::connect(a, b, GetParam(), 8);
  late_from->send(test::bytes_message(1, "late"));
  EXPECT_EQ(test::text_of(late_to->recv(1, 20s)), "late");
  flooding = false;
  trainer.join();
  receiver.join();
  watcher.join();
  EXPECT_GE(received, 100);
  // Threads: at most one per pending handshake, plus the test's own three,
  // the late dial's accept, and the channel's receive threads.
  EXPECT_LE(most_threads.load(), before + 64 + 16)
    << "before the flood: " << before;
  for (int fd : silent)
    ::close(fd);
}

TEST_P(transport_flood, a_silent_connection_is_refused_after_the_timeout) {
  auto o = test::options_for(1, GetParam());
  o.handshake_timeout = 200ms;
  std::vector<std::string> lines;
  std::mutex lines_mutex;
  o.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> g(lines_mutex);
    lines.push_back(line);
  };
  endpoint b(o);
  int fd = open_silent(b, GetParam());
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(eventually([&] { return b.refused() == 1; }));
  EXPECT_TRUE(eventually([&] { return b.pending_handshakes() == 0; }));
  // The dialer's end was closed.
  char c = 0;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0);
  ::close(fd);
  std::lock_guard<std::mutex> g(lines_mutex);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("node 1: " + GetParam() + ": refused"),
            std::string::npos)
    << lines[0];
}

TEST_P(transport_flood, one_handshake_slot_serves_dials_in_turn) {
  // One slot: dials one after another each find it free again (the
  // finished handshake's thread is reaped), none is refused.
  auto o = test::options_for(1, GetParam());
  o.max_pending_handshakes = 1;
  endpoint b(o);
  endpoint a(test::options_for(0, GetParam()));
  // Sequential dials each get the free slot.
  for (std::uint64_t id = 1; id <= 3; ++id) {
    auto [x, y] = test::connect(a, b, GetParam(), id);
    x->send(test::bytes_message(1, "hi"));
    EXPECT_EQ(test::text_of(y->recv(1, 20s)), "hi");
  }
  EXPECT_EQ(b.refused(), 0u);
}

INSTANTIATE_TEST_SUITE_P(stream, transport_flood,
                         ::testing::Values("shm", "tcp"));

TEST(transport_flood_shm,
     a_peer_of_another_user_is_refused_before_its_handshake) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root to connect as another user";
  std::vector<std::string> lines;
  std::mutex lines_mutex;
  auto o = test::options_for(1, "shm");
  o.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> g(lines_mutex);
    lines.push_back(line);
  };
  endpoint b(o);
  pid_t child = ::fork();
  if (child == 0) {
    // nobody: connects, then reports whether the listener closed it unread.
    if (::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0)
      ::_exit(10);
    int fd = open_silent(b, "shm");
    if (fd < 0)
      ::_exit(11);
    char c = 0;
    ::_exit(::recv(fd, &c, 1, 0) == 0 ? 0 : 12);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
    << "10/11: could not connect; 12: kept open";
  EXPECT_EQ(b.pending_handshakes(), 0u);
  std::lock_guard<std::mutex> g(lines_mutex);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("uid 65534"), std::string::npos) << lines[0];
}

TEST(transport_throttled_report, folds_lines_within_the_interval) {
  std::vector<std::string> lines;
  throttled_report hourly([&](const std::string& l) { lines.push_back(l); },
                          std::chrono::hours(1));
  hourly("first");
  hourly("second");
  hourly("third");
  EXPECT_EQ(hourly.count(), 3u);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "first");

  lines.clear();
  throttled_report every([&](const std::string& l) { lines.push_back(l); },
                         std::chrono::milliseconds(0));
  every("a");
  every("b");
  EXPECT_EQ(lines, (std::vector<std::string>{"a", "b"}));
  throttled_report silent({}); // an empty sink only counts
  silent("x");
  EXPECT_EQ(silent.count(), 1u);
}

} // namespace
} // namespace h2::transport
