// The coordinator's CAF port against peers without the job's secret (issue
// 24, docs/transport.md "TLS"): the nodes' actor systems talk mutual TLS
// with the identity every node derives from the secret, so a client with
// another identity, or none, fails the TLS handshake and no byte of it
// reaches CAF's message layer; BASP headers announcing huge payloads cost
// rank 0 no memory; silent connections hold at most 64 slots, the oldest
// cut off for newer ones; and the job, once its second node joins, trains
// to its end. Every process is real; rank 0 is an h2-node.
#include "launch.hpp"
#include "process_status.hpp"

#include "h2/transport/job_credentials.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>

namespace h2::test {
namespace {

const std::string secret_text = "0123456789abcdef0123456789abcdef";

/// A TCP connection to HOST:PORT, -1 when it fails.
int connect_to(const std::string& where) {
  const auto colon = where.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port =
    htons(static_cast<std::uint16_t>(std::stoi(where.substr(colon + 1))));
  if (::inet_pton(AF_INET, where.substr(0, colon).c_str(), &addr.sin_addr) !=
      1)
    return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
    return fd;
  if (fd >= 0)
    ::close(fd);
  return -1;
}

/// Whether the peer ended connection `fd` (it reads as closed).
bool ended(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0)
    return false;
  char c = 0;
  return ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
}

/// A CAF 0.17 BASP header (32 bytes: operation, padding, flags, payload
/// length, operation data, source and destination actor ids) announcing a
/// 1 GiB payload for a message to actor `dest`, in network byte order or in
/// the host's.
std::string basp_header(bool network_order, std::uint64_t dest) {
  std::string h(32, '\0');
  h[0] = 1; // direct_message
  const std::array<char, 4> length_be = {0x40, 0, 0, 0};
  for (std::size_t i = 0; i < 4; ++i)
    h[4 + i] = length_be[network_order ? i : 3 - i];
  for (std::size_t i = 0; i < 8; ++i)
    h[24 + i] = static_cast<char>(dest >> (8 * (network_order ? 7 - i : i)));
  return h;
}

class apps_caf_port : public ::testing::Test {
protected:
  /// Writes the identity derived from `secret` as NAME.pem and NAME.key.
  void write_identity(const std::string& name, const std::string& secret) {
    const auto c =
      transport::derive_tls_credentials(transport::job_secret(secret));
    dir_.write(name + ".pem", c.certificate_pem);
    dir_.write_private(name + ".key", c.key_pem);
  }

  /// openssl s_client's exit code for a TLS handshake with `where`,
  /// presenting identity `name` (none: "") and trusting job.pem.
  int handshake(const std::string& where, const std::string& name) {
    const std::string d = dir_.path().string();
    // TLS 1.2: under 1.3 the server refuses a client certificate after the
    // client has finished, and s_client would report success.
    std::string cmd = "openssl s_client -tls1_2 -connect " + where +
                      " -CAfile '" + d +
                      "/job.pem' -verify_return_error";
    if (!name.empty())
      cmd += " -cert '" + d + "/" + name + ".pem' -key '" + d + "/" + name +
             ".key'";
    cmd += " </dev/null >'" + d + "/s_client.txt' 2>&1";
    return std::system(cmd.c_str());
  }

  scratch_dir dir_;
};

TEST_F(apps_caf_port, peers_without_the_secret_reach_nothing_and_cost_nothing) {
  auto job = dir_.write("job.toml", small_job);
  auto secret = dir_.write_private("secret", secret_text);
  write_identity("job", secret_text);
  write_identity("other", "another secret, 32 bytes long...");
  child_process rank0(
    node_binary,
    {"--job", job.string(), "--node-rank", "0", "--world-size", "2",
     "--coordinator", "127.0.0.1:0", "--secret-file", secret.string(),
     "--no-metrics"},
    dir_ / "out0.txt", dir_ / "err0.txt");
  const std::string where = coordinator_of(rank0);
  ASSERT_FALSE(where.empty()) << rank0.err();
  EXPECT_NE(rank0.out().find("over TLS (the job's TLS identity"),
            std::string::npos)
    << rank0.out();

  // Only the identity derived from the job's secret completes a handshake.
  EXPECT_NE(handshake(where, "other"), 0) << read_text(dir_ / "s_client.txt");
  EXPECT_NE(handshake(where, ""), 0) << read_text(dir_ / "s_client.txt");
  EXPECT_EQ(handshake(where, "job"), 0) << read_text(dir_ / "s_client.txt");
  const long before = rss_kib_of(rank0.pid());
  ASSERT_GT(before, 0);

  // BASP headers announcing 1 GiB each, to the first 64 actor ids, in both
  // byte orders: without TLS, each once cost rank 0 a GiB.
  std::vector<int> forged;
  for (std::uint64_t dest = 1; dest <= 64; ++dest) {
    const int fd = connect_to(where);
    ASSERT_GE(fd, 0);
    const auto h = basp_header(dest % 2 == 0, dest);
    EXPECT_EQ(::send(fd, h.data(), h.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(h.size()));
    forged.push_back(fd);
  }
  // 200 connections that never speak: at most 64 stay open.
  constexpr int silent_count = 200;
  std::vector<int> silent;
  for (int i = 0; i < silent_count; ++i) {
    const int fd = connect_to(where);
    ASSERT_GE(fd, 0) << i;
    silent.push_back(fd);
  }
  const auto open_ones = [&] {
    return std::count_if(silent.begin(), silent.end(),
                         [](int fd) { return !ended(fd); });
  };
  EXPECT_TRUE(rank0.wait_until([&] { return open_ones() <= 64; }, run_timeout))
    << open_ones() << " silent connections open";
  EXPECT_TRUE(rank0.running()) << rank0.err();
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // Under ASan freed memory stays in its quarantine (256 MiB by default),
  // and TSan keeps shadow memory of its own, so resident memory says
  // nothing there: the bound is checked in the Release stage.
  const long after = rss_kib_of(rank0.pid());
  EXPECT_LT(after - before, 64 * 1024)
    << "rank 0 grew from " << before << " to " << after << " KiB";
#endif

  // The job goes on: node 1 joins past the silent connections and trains.
  expect_rank1_trains_to_the_end(rank0, job, secret, where, dir_);
  for (int fd : forged)
    ::close(fd);
  for (int fd : silent)
    ::close(fd);
}

} // namespace
} // namespace h2::test
