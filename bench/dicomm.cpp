// DiComm's backends against plain baselines measured in the same run
// (issue 3): shm throughput vs a single-thread memcpy and its one-way
// 64-byte latency vs a plain futex mailbox; tcp throughput vs a blocking
// socket sender/receiver and vs Gloo's TCP pair (CRC off), its 64-byte
// ping-pong vs the raw socket's, and the one-way time of a 64-byte message
// to a receiver that sleeps (one wake-up) vs a blocking socket recv. Both
// ends live in this process, on two threads (the shm and tcp paths are the
// ones two processes use: an abstract Unix socket and memfd rings, a
// loopback TCP connection).
#include "bench_common.hpp"
#include "channel_pair.hpp"

#include "h2/transport/endpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#if H2_BENCH_GLOO
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#endif

#include <arpa/inet.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

namespace h2::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

constexpr std::uint64_t MiB = 1 << 20;
constexpr auto wait_long = std::chrono::seconds(60);

/// Bytes per second of a single-thread memcpy of `bytes` (warm buffers).
double memcpy_throughput(std::uint64_t bytes, int n) {
  std::vector<char> src(bytes, 7), dst(bytes);
  std::memcpy(dst.data(), src.data(), bytes);
  auto t0 = clock_type::now();
  for (int i = 0; i < n; ++i) {
    src[static_cast<std::size_t>(i) % bytes] = static_cast<char>(i);
    std::memcpy(dst.data(), src.data(), bytes);
  }
  return static_cast<double>(bytes) * n / seconds_since(t0);
}

/// One-way latency of a 64-byte message: half a ping-pong's round trip.
double channel_latency(channel_pair& p, int rounds) {
  auto echo = std::async(std::launch::async, [&] {
    for (int i = 0; i < rounds + 100; ++i) {
      auto m = p.rx->recv(1, wait_long);
      m.tag = 2;
      p.rx->send(std::move(m));
    }
  });
  auto ping = [&] {
    transport::message m;
    m.tag = 1;
    m.bytes.resize(64);
    p.tx->send(std::move(m));
    p.tx->recv(2, wait_long);
  };
  for (int i = 0; i < 100; ++i)
    ping();
  auto t0 = clock_type::now();
  for (int i = 0; i < rounds; ++i)
    ping();
  double s = seconds_since(t0);
  echo.get();
  return s / rounds / 2;
}

/// Pause before each message of the asleep latencies: longer than any
/// receive polls (transport/spin.hpp: at most 500 us), so that the receiver
/// sleeps when the message comes.
constexpr auto asleep_gap = std::chrono::milliseconds(1);

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           clock_type::now().time_since_epoch())
    .count();
}

/// One-way latency of a 64-byte message to a receiver that sleeps when it
/// comes (one wake-up): the median over `n` messages, each sent
/// `asleep_gap` after the last, of its receive time minus its send time.
double channel_latency_asleep(channel_pair& p, int n) {
  std::vector<double> seconds(static_cast<std::size_t>(n));
  auto rx = std::async(std::launch::async, [&] {
    for (int i = 0; i < n; ++i) {
      auto m = p.rx->recv(3, wait_long);
      const std::int64_t now = now_ns();
      std::int64_t sent = 0;
      std::memcpy(&sent, m.bytes.data(), sizeof(sent));
      seconds[static_cast<std::size_t>(i)] =
        static_cast<double>(now - sent) * 1e-9;
    }
  });
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_for(asleep_gap);
    transport::message m;
    m.tag = 3;
    m.bytes.resize(64);
    const std::int64_t sent = now_ns();
    std::memcpy(m.bytes.data(), &sent, sizeof(sent));
    p.tx->send(std::move(m));
  }
  rx.get();
  return quantile(seconds, 0.5);
}

/// A plain futex mailbox: one 64-byte slot and a sequence word; the reader
/// sleeps in FUTEX_WAIT, the writer wakes it.
struct futex_mailbox {
  std::atomic<std::uint32_t> seq{0};
  char slot[64];

  void put(const char* data, std::uint32_t s) {
    std::memcpy(slot, data, 64);
    seq.store(s, std::memory_order_release);
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq),
            FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }
  void take(char* out, std::uint32_t s) {
    while (seq.load(std::memory_order_acquire) != s)
      syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq),
              FUTEX_WAIT_PRIVATE, s - 1, nullptr, nullptr, 0);
    std::memcpy(out, slot, 64);
  }
};

double futex_latency(int rounds) {
  futex_mailbox there, back;
  auto echo = std::thread([&] {
    char buf[64];
    for (int i = 1; i <= rounds + 100; ++i) {
      there.take(buf, static_cast<std::uint32_t>(i));
      back.put(buf, static_cast<std::uint32_t>(i));
    }
  });
  char buf[64] = {};
  clock_type::time_point t0;
  for (int i = 1; i <= rounds + 100; ++i) {
    if (i == 101)
      t0 = clock_type::now();
    there.put(buf, static_cast<std::uint32_t>(i));
    back.take(buf, static_cast<std::uint32_t>(i));
  }
  double s = seconds_since(t0);
  echo.join();
  return s / rounds / 2;
}

// -- raw sockets
// -----------------------------------------------------------------

/// A connected loopback TCP pair (TCP_NODELAY), blocking.
struct socket_pair {
  int a = -1, b = -1;

  socket_pair() {
    int l = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    H2_ENFORCE(::bind(l, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
                 ::listen(l, 1) == 0 &&
                 ::getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len) ==
                   0,
               "loopback listen");
    a = ::socket(AF_INET, SOCK_STREAM, 0);
    H2_ENFORCE(::connect(a, reinterpret_cast<sockaddr*>(&addr), len) == 0,
               "loopback connect");
    b = ::accept(l, nullptr, nullptr);
    ::close(l);
    int one = 1;
    ::setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~socket_pair() {
    ::close(a);
    ::close(b);
  }
};

void send_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    auto k = ::send(fd, p, n, MSG_NOSIGNAL);
    H2_ENFORCE(k > 0, "send");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, char* p, std::size_t n) {
  while (n > 0) {
    auto k = ::recv(fd, p, n, 0);
    H2_ENFORCE(k > 0, "recv");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

double socket_throughput(std::uint64_t bytes, int n) {
  socket_pair s;
  std::vector<char> src(bytes, 7), dst(bytes);
  auto once = [&](int count) {
    auto rx = std::async(std::launch::async, [&] {
      for (int i = 0; i < count; ++i)
        recv_all(s.b, dst.data(), bytes);
    });
    for (int i = 0; i < count; ++i)
      send_all(s.a, src.data(), bytes);
    rx.get();
  };
  once(2);
  auto t0 = clock_type::now();
  once(n);
  return static_cast<double>(bytes) * n / seconds_since(t0);
}

double socket_latency(int rounds) {
  socket_pair s;
  auto echo = std::thread([&] {
    char buf[64];
    for (int i = 0; i < rounds + 100; ++i) {
      recv_all(s.b, buf, 64);
      send_all(s.b, buf, 64);
    }
  });
  char buf[64] = {};
  clock_type::time_point t0;
  for (int i = 0; i < rounds + 100; ++i) {
    if (i == 100)
      t0 = clock_type::now();
    send_all(s.a, buf, 64);
    recv_all(s.a, buf, 64);
  }
  double sec = seconds_since(t0);
  echo.join();
  return sec / rounds / 2;
}

/// channel_latency_asleep() over a raw socket pair (blocking recv).
double socket_latency_asleep(int n) {
  socket_pair s;
  std::vector<double> seconds(static_cast<std::size_t>(n));
  auto rx = std::thread([&] {
    char buf[64];
    for (int i = 0; i < n; ++i) {
      recv_all(s.b, buf, 64);
      const std::int64_t now = now_ns();
      std::int64_t sent = 0;
      std::memcpy(&sent, buf, sizeof(sent));
      seconds[static_cast<std::size_t>(i)] =
        static_cast<double>(now - sent) * 1e-9;
    }
  });
  char buf[64] = {};
  for (int i = 0; i < n; ++i) {
    std::this_thread::sleep_for(asleep_gap);
    const std::int64_t sent = now_ns();
    std::memcpy(buf, &sent, sizeof(sent));
    send_all(s.a, buf, 64);
  }
  rx.join();
  return quantile(seconds, 0.5);
}

#if H2_BENCH_GLOO
/// Gloo's TCP pair: rank 0 sends `n` buffers of `bytes` to rank 1 (unbound
/// buffers, the API torch.distributed's Gloo backend uses for send/recv).
double gloo_throughput(std::uint64_t bytes, int n) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto device = gloo::transport::tcp::CreateDevice(attr);
  std::vector<char> src(bytes, 7), dst(bytes);
  double result = 0;
  auto rank = [&](int r) {
    auto ctx = std::make_shared<gloo::rendezvous::Context>(r, 2);
    ctx->connectFullMesh(*store, device);
    if (r == 0) {
      auto buf = ctx->createUnboundBuffer(src.data(), bytes);
      auto once = [&](int count) {
        for (int i = 0; i < count; ++i) {
          buf->send(1, 0);
          buf->waitSend();
        }
      };
      once(2);
      auto t0 = clock_type::now();
      once(n);
      // The receiver's last completion ends the measurement.
      auto ack = ctx->createUnboundBuffer(dst.data(), 1);
      ack->recv(1, 1);
      ack->waitRecv();
      result = static_cast<double>(bytes) * n / seconds_since(t0);
    } else {
      auto buf = ctx->createUnboundBuffer(dst.data(), bytes);
      for (int i = 0; i < n + 2; ++i) {
        buf->recv(0, 0);
        buf->waitRecv();
      }
      auto ack = ctx->createUnboundBuffer(dst.data(), 1);
      ack->send(0, 1);
      ack->waitSend();
    }
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  return result;
}

#endif

int messages_for(std::uint64_t bytes) {
  return static_cast<int>(std::max<std::uint64_t>(8, 1024 * MiB / bytes / 2));
}

/// The median of `repeats` runs of `f` (the machine is shared and noisy).
template <class F>
double median_of(int repeats, F f) {
  std::vector<double> xs;
  for (int i = 0; i < repeats; ++i)
    xs.push_back(f());
  return quantile(xs, 0.5);
}

} // namespace
} // namespace h2::bench

int main(int argc, char** argv) {
  using namespace h2::bench;
  at::set_num_threads(1);
  std::vector<record> out;
  auto add = [&](record r) {
    print(r);
    out.push_back(std::move(r));
  };
  const std::vector<std::uint64_t> sizes = {1 * MiB, 4 * MiB, 16 * MiB,
                                            64 * MiB};
  const int repeats = 5;
  // `--only shm` or `--only tcp` runs one backend's part (for profiling).
  const std::string only = flag_value(argc, argv, "--only");

  if (only.empty() || only == "shm") {
    std::printf("== shm\n");
    channel_pair shm("shm", false);
    for (auto bytes : sizes) {
      int n = messages_for(bytes);
      double base =
        median_of(repeats, [&] { return memcpy_throughput(bytes, n); });
      double v =
        median_of(repeats, [&] { return channel_throughput(shm, bytes, n); });
      add({"shm_throughput_" + std::to_string(bytes / MiB) + "MiB", v / 1e9,
           "GB/s", base / 1e9, v / base,
           "baseline: single-thread memcpy; target >= 0.8"});
    }
    double base = median_of(repeats, [] { return futex_latency(20000); });
    double v = median_of(repeats, [&] { return channel_latency(shm, 20000); });
    add({"shm_latency_64B_one_way", v * 1e6, "us", base * 1e6, v / base,
         "baseline: futex mailbox; target <= 0.333"});
  }

  if (only.empty() || only == "tcp") {
    std::printf("== tcp (CRC off)\n");
    channel_pair tcp("tcp", false);
    for (auto bytes : sizes) {
      int n = messages_for(bytes);
      double raw =
        median_of(repeats, [&] { return socket_throughput(bytes, n); });
      double v =
        median_of(repeats, [&] { return channel_throughput(tcp, bytes, n); });
      add({"tcp_throughput_" + std::to_string(bytes / MiB) + "MiB_vs_socket",
           v / 1e9, "GB/s", raw / 1e9, v / raw,
           "baseline: blocking socket pair; target >= 0.9"});
#if H2_BENCH_GLOO
      double gloo =
        median_of(repeats, [&] { return gloo_throughput(bytes, n); });
      add({"tcp_throughput_" + std::to_string(bytes / MiB) + "MiB_vs_gloo",
           v / 1e9, "GB/s", gloo / 1e9, v / gloo,
           "baseline: Gloo TCP pair send/recv; target >= 0.95"});
#else
      std::printf("(no Gloo comparison: built without libgloo-dev)\n");
#endif
    }
    double base = median_of(repeats, [] { return socket_latency(5000); });
    double v = median_of(repeats, [&] { return channel_latency(tcp, 5000); });
    add({"tcp_latency_64B_one_way", v * 1e6, "us", base * 1e6, v / base,
         "baseline: raw socket ping-pong"});
    base = median_of(repeats, [] { return socket_latency_asleep(300); });
    v = median_of(repeats, [&] { return channel_latency_asleep(tcp, 300); });
    add({"tcp_latency_64B_one_way_asleep", v * 1e6, "us", base * 1e6, v / base,
         "receiver asleep (1 ms between messages); baseline: blocking "
         "socket recv"});
  }
  if (only.empty() || only == "tcp") {
    channel_pair tcp("tcp", true);
    int n = messages_for(16 * MiB);
    double raw =
      median_of(repeats, [&] { return socket_throughput(16 * MiB, n); });
    double v =
      median_of(repeats, [&] { return channel_throughput(tcp, 16 * MiB, n); });
    add({"tcp_throughput_16MiB_crc_on_vs_socket", v / 1e9, "GB/s", raw / 1e9,
         v / raw, "CRC32C on every frame"});
  }
  if (auto path = out_path(argc, argv); !path.empty())
    append_results(path, out);
  return 0;
}
