// choose_backend(): one table walked in order, inproc first
// (docs/transport.md, Which backend). Pure over addresses, so it runs in
// every build, rdma row included; and what an endpoint's listeners report
// when they cannot bind.
#include "h2/transport/endpoint.hpp"

#include "pairs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace h2::transport {
namespace {

const std::vector<std::string> all = {"shm", "rdma", "tcp"};

endpoint_address node(int rank, const std::string& host) {
  endpoint_address a;
  a.node_rank = rank;
  a.host_id = host;
  a.tcp_host = "127.0.0.1";
  a.tcp_port = static_cast<std::uint16_t>(40000 + rank);
  a.shm_socket = "h2-shm-test-" + std::to_string(rank);
  return a;
}

endpoint_address with_rdma(endpoint_address a) {
  a.rdma_device = "mlx5_0";
  a.rdma_port = static_cast<std::uint16_t>(a.tcp_port + 1000);
  return a;
}

/// The key path of the config_error `f` throws, and its message.
template <class F>
std::pair<std::string, std::string> config_error_of(F&& f) {
  try {
    f();
  } catch (const config_error& e) {
    return {e.key_path(), e.what()};
  }
  ADD_FAILURE() << "no config_error";
  return {};
}

TEST(transport_choose_backend, same_node_is_inproc) {
  auto a = node(0, "host-a");
  EXPECT_EQ(choose_backend(a, a, all, ""), "inproc");
  EXPECT_EQ(choose_backend(a, a, all, "auto"), "inproc");
  // Also when no backend between processes is enabled.
  EXPECT_EQ(choose_backend(a, a, {}, ""), "inproc");
}

TEST(transport_choose_backend, forcing_applies_only_between_nodes) {
  auto a = node(0, "host-a");
  for (const char* forced : {"shm", "tcp", "rdma"})
    EXPECT_EQ(choose_backend(a, a, all, forced), "inproc") << forced;
}

TEST(transport_choose_backend, same_host_is_shm) {
  auto a = node(0, "host-a");
  auto b = node(1, "host-a");
  EXPECT_EQ(choose_backend(a, b, all, ""), "shm");
  // shm wins over rdma on one host.
  EXPECT_EQ(choose_backend(with_rdma(a), with_rdma(b), all, ""), "shm");
  // Without shm running on one end, the next row decides.
  b.shm_socket.clear();
  EXPECT_EQ(choose_backend(a, b, all, ""), "tcp");
}

TEST(transport_choose_backend, devices_on_both_ends_is_rdma) {
  auto a = with_rdma(node(0, "host-a"));
  auto b = with_rdma(node(1, "host-b"));
  EXPECT_EQ(choose_backend(a, b, all, ""), "rdma");
  // Only when enabled.
  EXPECT_EQ(choose_backend(a, b, {"shm", "tcp"}, ""), "tcp");
  // A device on one end only is tcp.
  EXPECT_EQ(choose_backend(a, node(1, "host-b"), all, ""), "tcp");
}

TEST(transport_choose_backend, anything_else_is_tcp) {
  auto a = node(0, "host-a");
  auto b = node(1, "host-b");
  EXPECT_EQ(choose_backend(a, b, all, ""), "tcp");
  EXPECT_EQ(choose_backend(a, b, all, "auto"), "tcp");
}

TEST(transport_choose_backend, the_order_of_enabled_does_not_matter) {
  auto a = with_rdma(node(0, "host-a"));
  auto b = with_rdma(node(1, "host-a"));
  EXPECT_EQ(choose_backend(a, b, {"tcp", "rdma", "shm"}, ""), "shm");
  b.host_id = "host-b";
  EXPECT_EQ(choose_backend(a, b, {"tcp", "rdma", "shm"}, ""), "rdma");
}

TEST(transport_choose_backend, forced_backend_is_honoured_between_nodes) {
  auto a = with_rdma(node(0, "host-a"));
  auto b = with_rdma(node(1, "host-a"));
  EXPECT_EQ(choose_backend(a, b, all, "tcp"), "tcp");
  EXPECT_EQ(choose_backend(a, b, all, "rdma"), "rdma");
  EXPECT_EQ(choose_backend(a, b, all, "shm"), "shm");
}

TEST(transport_choose_backend,
     forced_backend_that_cannot_connect_is_config_error) {
  auto a = node(0, "host-a");
  auto b = node(1, "host-b");
  auto [key, what] = config_error_of([&] { choose_backend(a, b, all, "shm"); });
  EXPECT_EQ(key, "transport.backend");
  EXPECT_NE(what.find("node 0 and node 1"), std::string::npos) << what;
  EXPECT_NE(what.find("different hosts"), std::string::npos) << what;
  std::tie(key, what) =
    config_error_of([&] { choose_backend(a, b, all, "rdma"); });
  EXPECT_EQ(key, "transport.backend");
  // inproc joins chips of one node only.
  std::tie(key, what) =
    config_error_of([&] { choose_backend(a, b, all, "inproc"); });
  EXPECT_EQ(key, "transport.backend");
  // Forced but not enabled.
  std::tie(key, what) = config_error_of(
    [&] { choose_backend(with_rdma(a), with_rdma(b), {"tcp"}, "rdma"); });
  EXPECT_EQ(key, "transport.backend");
  EXPECT_NE(what.find("not enabled"), std::string::npos) << what;
}

TEST(transport_choose_backend, unknown_forced_backend_is_config_error) {
  auto a = node(0, "host-a");
  auto b = node(1, "host-b");
  auto [key, what] =
    config_error_of([&] { choose_backend(a, b, all, "carrier-pigeon"); });
  EXPECT_EQ(key, "transport.backend");
  EXPECT_NE(what.find("unknown backend \"carrier-pigeon\""), std::string::npos)
    << what;
  EXPECT_NE(what.find("\"tcp\""), std::string::npos) << what; // the known ones
}

TEST(transport_choose_backend, no_row_connects_is_config_error) {
  auto a = node(0, "host-a");
  auto b = node(1, "host-b");
  b.tcp_port = 0;
  auto [key, what] = config_error_of([&] { choose_backend(a, b, all, ""); });
  EXPECT_EQ(key, "transport.backend");
  EXPECT_NE(what.find("no backend connects node 0 and node 1"),
            std::string::npos)
    << what;
}

TEST(transport_choose_backend, available_backends_follow_the_table) {
  auto built = available_backends();
  ASSERT_GE(built.size(), 2u);
  EXPECT_EQ(built.front(), "shm");
  EXPECT_EQ(built.back(), "tcp");
  EXPECT_EQ(std::find(built.begin(), built.end(), "inproc"), built.end());
}

TEST(transport_endpoint, an_endpoint_runs_no_inproc_or_unknown_backend) {
  for (const char* name : {"inproc", "carrier-pigeon"}) {
    auto o = test::options_for(0, name);
    auto [key, what] = config_error_of([&] { endpoint e(o); });
    EXPECT_EQ(key, "transport.backend") << what;
  }
}

TEST(transport_endpoint, tcp_bind_failure_names_the_address_and_errno) {
  // TEST-NET-1 (RFC 5737): never an address of this host.
  auto o = test::options_for(0, "tcp");
  o.bind_host = "192.0.2.1";
  try {
    endpoint e(o);
    ADD_FAILURE() << "bound to an address this host does not have";
  } catch (const bind_error& e) {
    EXPECT_EQ(e.address(), "192.0.2.1:0");
    EXPECT_EQ(e.sys_errno(), EADDRNOTAVAIL);
    std::string what = e.what();
    EXPECT_NE(what.find("tcp: cannot listen on 192.0.2.1:0"), std::string::npos)
      << what;
    EXPECT_NE(what.find(std::strerror(EADDRNOTAVAIL)), std::string::npos)
      << what;
  }
}

TEST(transport_endpoint, bind_host_that_is_no_address_is_config_error) {
  auto o = test::options_for(0, "tcp");
  o.bind_host = "not-an-address";
  auto [key, what] = config_error_of([&] { endpoint e(o); });
  EXPECT_EQ(key, "transport.bind");
  EXPECT_NE(what.find("not-an-address"), std::string::npos) << what;
}

} // namespace
} // namespace h2::transport
