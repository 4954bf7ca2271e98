// Runs only in test_transport_rdma_emulated, against fake_verbs: after real
// traffic through the rdma backend, the fabric must have seen no write
// outside a registered ring, no queue or completion-queue overflow, and no
// immediate without a posted receive (the credit and notification
// accounting of ring.hpp, as the backend applies it). The same executable
// runs the conformance, fault and rdma suites over the fake device.
#include "fake_verbs.hpp"
#include "pairs.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

message bytes_message(std::uint64_t tag, std::size_t bytes, char fill) {
  message m;
  m.tag = tag;
  m.bytes.assign(bytes, static_cast<std::byte>(fill));
  return m;
}

TEST(transport_rdma_emulated, the_fake_device_is_found) {
  EXPECT_EQ(test::unavailable("rdma"), "");
}

TEST(transport_rdma_emulated, traffic_stays_within_what_hardware_allows) {
  const auto before = fake_verbs::totals();
  {
    auto [a, b] = test::make_pair_over("rdma");
    // Bursts of small messages both ways (notifications, not bytes, run
    // out first), sizes that straddle the ring's end, and streams far
    // larger than the 1 MiB ring (bytes run out first).
    auto burst = [](channel& self, char fill) {
      for (int i = 0; i < 3000; ++i)
        self.send(bytes_message(1, 1 + (i * 7919) % 3000, fill));
      message big;
      big.tag = 2;
      big.tensor = at::full({3 * 1024 * 1024 + 17}, fill, at::kByte);
      self.send(std::move(big));
    };
    std::thread ta([&] { burst(*a, 'a'); });
    std::thread tb([&] { burst(*b, 'b'); });
    for (int i = 0; i < 3000; ++i) {
      message from_b = a->recv(1, 20s);
      message from_a = b->recv(1, 20s);
      ASSERT_EQ(from_a.bytes.size(), 1 + (i * 7919) % 3000u);
      ASSERT_EQ(from_b.bytes.size(), from_a.bytes.size());
      ASSERT_EQ(from_a.bytes.back(), std::byte{'a'});
      ASSERT_EQ(from_b.bytes.front(), std::byte{'b'});
    }
    message big_a = b->recv(2, 20s);
    message big_b = a->recv(2, 20s);
    ta.join();
    tb.join();
    EXPECT_TRUE(big_a.tensor.eq('a').all().item<bool>());
    EXPECT_TRUE(big_b.tensor.eq('b').all().item<bool>());
    a->close();
    b->close();
  }
  const auto after = fake_verbs::totals();
  EXPECT_GT(after.writes, before.writes + 2 * 3000);
  EXPECT_EQ(after.rnr, before.rnr) << "an immediate found no receive";
  EXPECT_EQ(after.send_overflow, before.send_overflow);
  EXPECT_EQ(after.recv_overflow, before.recv_overflow);
  EXPECT_EQ(after.cq_overflow, before.cq_overflow);
  EXPECT_EQ(after.remote_access, before.remote_access);
  // Both links were torn down with their channels.
  EXPECT_EQ(after.live_queue_pairs, before.live_queue_pairs);
}

TEST(transport_rdma_emulated, endpoints_may_go_before_their_channels) {
  // make_pair_over() lets both endpoints (and their rdma_cm listener) go
  // before the test uses the channels: links own what they need.
  auto [a, b] = test::make_pair_over("rdma");
  a->send(bytes_message(3, 10, 'x'));
  EXPECT_EQ(b->recv(3, 20s).bytes.size(), 10u);
}

} // namespace
} // namespace h2::transport
