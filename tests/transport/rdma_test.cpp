// The rdma backend. Discovery and the fallback run everywhere (on machines
// without a device they check that nothing fails and another backend is
// chosen); the channel tests need a device and GTEST_SKIP() with the reason
// where there is none. The conformance and fault suites run rdma too
// (channel_test.cpp, fault_test.cpp); these add what is specific to its
// rings and credits. Compiled when rdma-core is (H2_HAS_RDMA).
#include "pairs.hpp"

#include "h2/transport/rdma/backend.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

using test::patience;

using test::bytes_message;
using test::error_of;
using test::text_of;

endpoint_options all_backends(int rank) {
  auto o = test::options_for(rank, "tcp");
  o.backends = {"shm", "rdma", "tcp"};
  return o;
}

// -- everywhere ---------------------------------------------------------------

TEST(transport_rdma_discovery, probe_says_why_when_it_finds_nothing) {
  auto probe = rdma::probe_devices();
  if (probe.devices.empty()) {
    EXPECT_FALSE(probe.why_none.empty());
  } else {
    EXPECT_TRUE(probe.why_none.empty()) << probe.why_none;
    for (const auto& name : probe.devices)
      EXPECT_FALSE(name.empty());
  }
}

TEST(transport_rdma_discovery, built_backends_include_rdma) {
  auto built = available_backends();
  EXPECT_NE(std::find(built.begin(), built.end(), "rdma"), built.end());
}

TEST(transport_rdma_discovery, start_fills_the_address_only_with_a_device) {
  // "Usable": a device, and rdma_cm reaches it on the test's loopback
  // address. On the build machines: no device at all.
  const bool device = test::unavailable("rdma").empty();
  endpoint a(all_backends(0));
  endpoint b(all_backends(1));
  const std::vector<std::string> enabled = {"shm", "rdma", "tcp"};
  endpoint_address far = b.address();
  far.host_id = "another host"; // as seen from a: shm cannot join them
  if (!device) {
    // What the build machines show: rdma runs, finds nothing, fails
    // nothing, and the endpoint chooses shm or tcp.
    EXPECT_EQ(a.address().rdma_device, "");
    EXPECT_EQ(a.address().rdma_port, 0);
    EXPECT_EQ(choose_backend(a.address(), b.address(), enabled, ""), "shm");
    EXPECT_EQ(choose_backend(a.address(), far, enabled, ""), "tcp");
    EXPECT_THROW(choose_backend(a.address(), far, enabled, "rdma"),
                 config_error);
  } else {
    EXPECT_NE(a.address().rdma_device, "");
    EXPECT_NE(a.address().rdma_port, 0);
    EXPECT_EQ(choose_backend(a.address(), b.address(), enabled, ""), "shm");
    EXPECT_EQ(choose_backend(a.address(), far, enabled, ""), "rdma");
  }
  // Either way the pair talks over what was chosen.
  const std::string chosen = choose_backend(a.address(), far, enabled, "");
  auto [x, y] = test::connect(a, b, chosen);
  EXPECT_EQ(x->backend(), chosen);
  x->send(bytes_message(1, "hello"));
  EXPECT_EQ(text_of(y->recv(1, patience)), "hello");
}

TEST(transport_rdma_discovery, dialing_rdma_without_a_device_is_refused) {
  if (!rdma::probe_devices().devices.empty())
    GTEST_SKIP() << "this machine has an RDMA device";
  endpoint a(test::options_for(0, "rdma")); // rdma alone: still starts
  endpoint b(test::options_for(1, "rdma"));
  EXPECT_THROW(
    a.dial(b.address(), 1, "rdma", std::chrono::steady_clock::now() + 5s),
    config_error);
}

TEST(transport_rdma_discovery, ring_size_is_its_own_option_and_checked) {
  // The rdma ring no longer follows the shm ring: a 0-byte shm ring is the
  // shm backend's error alone.
  auto o = test::options_for(0, "rdma");
  o.shm_ring_bytes = 0;
  EXPECT_NO_THROW(endpoint e(o));
  for (std::uint64_t bad : {std::uint64_t{0}, std::uint64_t{32} << 10,
                            (std::uint64_t{1} << 30) + 1}) {
    o = test::options_for(0, "rdma");
    o.rdma_ring_bytes = bad;
    try {
      endpoint e(o);
      ADD_FAILURE() << "an rdma ring of " << bad << " bytes was accepted";
    } catch (const config_error& e) {
      EXPECT_EQ(e.key_path(), "transport.rdma_ring_mb") << e.what();
    }
  }
}

// -- with a device ------------------------------------------------------------

class transport_rdma : public test::channel_pair_test<> {
protected:
  void SetUp() override { connect_over("rdma"); }
};

TEST_F(transport_rdma, one_tag_arrives_in_order) {
  // 2000: far more than the notifications in flight.
  ASSERT_NO_FATAL_FAILURE(
    test::expect_one_tag_in_order(*a_, *b_, 2000, patience));
  EXPECT_EQ(a_->backend(), "rdma");
}

TEST_F(transport_rdma, large_tensor_streams_through_the_ring) {
  constexpr std::int64_t n = 16 * 1024 * 1024; // 64 MiB of fp32
  at::Tensor sent = at::arange(n, at::kFloat);
  std::thread sender([&] {
    message m;
    m.tag = 4;
    m.tensor = sent;
    a_->send(std::move(m)); // 64 x the 1 MiB ring: credits must flow
  });
  message m = b_->recv(4, patience);
  sender.join();
  ASSERT_TRUE(m.tensor.defined());
  EXPECT_EQ(m.payload_bytes(), 64u << 20);
  EXPECT_TRUE(m.tensor.equal(at::arange(n, at::kFloat)));
}

TEST_F(transport_rdma, large_tensors_both_ways_at_once) {
  constexpr std::int64_t n = 4 * 1024 * 1024; // 16 MiB each way
  auto run = [&](channel& self, double start) {
    message m;
    m.tag = 1;
    m.tensor = at::arange(start, start + n, at::kDouble);
    self.send(std::move(m));
  };
  std::thread ta([&] { run(*a_, 0); });
  std::thread tb([&] { run(*b_, 1e9); });
  message from_b = a_->recv(1, patience);
  message from_a = b_->recv(1, patience);
  ta.join();
  tb.join();
  EXPECT_TRUE(from_a.tensor.equal(at::arange(0, n, at::kDouble)));
  EXPECT_TRUE(from_b.tensor.equal(at::arange(1e9, 1e9 + n, at::kDouble)));
}

TEST_F(transport_rdma, peer_close_is_peer_closed) {
  a_->send(bytes_message(1, "last words"));
  a_->close();
  // What was sent before the close still arrives, then the close.
  EXPECT_EQ(text_of(b_->recv(1, patience)), "last words");
  EXPECT_EQ(error_of([&] { b_->recv(1, patience); }),
            transport_errc::peer_closed);
  EXPECT_EQ(error_of([&] { b_->send(bytes_message(1, "x")); }),
            transport_errc::peer_closed);
  EXPECT_EQ(error_of([&] { a_->send(bytes_message(1, "x")); }),
            transport_errc::cancelled);
}

} // namespace
} // namespace h2::transport
