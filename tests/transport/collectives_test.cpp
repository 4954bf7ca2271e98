// The ring all-reduce over real channels: R members on threads, inproc and
// tcp links between ring neighbours.
#include "pairs.hpp"

#include "h2/transport/collectives.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <thread>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

/// Runs `collective(data, rank, size, io)` on `inputs` (one per member)
/// over in-process rings; returns every member's result.
template <class F>
std::vector<at::Tensor> on_ring(std::vector<at::Tensor> inputs, F collective) {
  const int size = static_cast<int>(inputs.size());
  // Channel i joins member i and member i + 1.
  std::vector<test::channel_pair> ring;
  for (int i = 0; i < size; ++i)
    ring.push_back(test::make_pair_over("inproc"));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      channel& to_next = *ring[static_cast<std::size_t>(r)].first;
      channel& from_prev =
        *ring[static_cast<std::size_t>((r + size - 1) % size)].second;
      ring_io io{
        [&](std::uint64_t tag, const at::Tensor& t) {
          message m;
          m.tag = tag;
          m.tensor = t;
          to_next.send(std::move(m));
        },
        [&](std::uint64_t tag) { return from_prev.recv(tag, 20s).tensor; },
        {}};
      collective(inputs[static_cast<std::size_t>(r)], r, size, io);
    });
  for (auto& t : threads)
    t.join();
  return inputs;
}

std::vector<at::Tensor> all_reduce(std::vector<at::Tensor> inputs,
                                   allreduce_options options) {
  return on_ring(std::move(inputs),
                 [&](at::Tensor& data, int r, int size, ring_io& io) {
                   auto o = options;
                   o.weight = r + 1.0;
                   ring_allreduce(data, r, size, o, io);
                 });
}

std::vector<at::Tensor> random_inputs(int size, std::int64_t n) {
  at::manual_seed(3);
  std::vector<at::Tensor> out;
  for (int r = 0; r < size; ++r)
    out.push_back(at::randn({n}));
  return out;
}

void expect_bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  ASSERT_EQ(a.numel(), b.numel());
  if (a.numel() == 0)
    return; // nothing to compare (and no data pointers to pass memcmp)
  EXPECT_EQ(0, std::memcmp(a.data_ptr(), b.data_ptr(),
                           static_cast<std::size_t>(a.numel()) * 4));
}

class transport_allreduce : public ::testing::TestWithParam<int> {};

TEST_P(transport_allreduce, sum_reaches_every_member_bitwise_equal) {
  const int size = GetParam();
  for (std::int64_t n : {0, 1, 7, 1000}) {
    auto inputs = random_inputs(size, n);
    at::Tensor expected = at::zeros({n});
    for (auto& t : inputs)
      expected += t;
    auto results = all_reduce(inputs, {});
    for (auto& r : results) {
      EXPECT_TRUE(at::allclose(r, expected, 1e-5, 1e-5)) << "n=" << n;
      expect_bitwise_equal(r, results[0]);
    }
  }
}

TEST_P(transport_allreduce, weighted_average) {
  const int size = GetParam();
  auto inputs = random_inputs(size, 100);
  allreduce_options o;
  o.op = reduce_op::weighted_average;
  o.total_weight = size * (size + 1) / 2.0; // weights 1..size
  at::Tensor expected = at::zeros({100});
  for (int r = 0; r < size; ++r)
    expected +=
      inputs[static_cast<std::size_t>(r)] * (r + 1.0) / o.total_weight;
  auto results = all_reduce(inputs, o);
  for (auto& r : results) {
    EXPECT_TRUE(at::allclose(r, expected, 1e-5, 1e-6));
    expect_bitwise_equal(r, results[0]);
  }
}

TEST_P(transport_allreduce, bf16_on_the_wire) {
  const int size = GetParam();
  auto inputs = random_inputs(size, 1000);
  at::Tensor expected = at::zeros({1000});
  for (auto& t : inputs)
    expected += t;
  allreduce_options o;
  o.wire_dtype = at::kBFloat16;
  auto results = all_reduce(inputs, o);
  for (auto& r : results) {
    // bf16 keeps 8 significant bits: each of the size - 1 hops rounds a
    // partial sum to 2^-8 relative; sums of unit normals stay below
    // 4 sqrt(size) in magnitude here.
    EXPECT_TRUE(at::allclose(r, expected, 2e-2, 2e-2 * size));
    expect_bitwise_equal(r, results[0]);
  }
}

// ZeRO-1's halves (docs/planner.md, "Sharded optimizer state"): after the
// reduce-scatter each member's owned share holds bitwise the all-reduce's
// sum of it; all-gathering the owned shares gives every member the
// all-reduce's result, in fp32 and with bf16 on the wire.
TEST_P(transport_allreduce, reduce_scatter_then_allgather_is_the_allreduce) {
  const int size = GetParam();
  for (auto wire : {at::kFloat, at::kBFloat16}) {
    allreduce_options o;
    o.wire_dtype = wire;
    const auto reduced = all_reduce(random_inputs(size, 1001), o);
    const auto scattered =
      on_ring(random_inputs(size, 1001),
              [&](at::Tensor& data, int r, int n, ring_io& io) {
                ring_reduce_scatter(data, r, n, o, io);
              });
    auto gathered = scattered;
    for (auto& t : gathered)
      t = t.clone();
    gathered =
      on_ring(gathered, [&](at::Tensor& data, int r, int n, ring_io& io) {
        allreduce_options fp32;
        ring_allgather(data, r, n, fp32, io, n - 1);
      });
    for (int r = 0; r < size; ++r) {
      const auto s = ring_share_of(1001, owned_share(r, size), size);
      expect_bitwise_equal(
        scattered[static_cast<std::size_t>(r)].narrow(0, s.begin, s.length),
        reduced[0].narrow(0, s.begin, s.length));
      expect_bitwise_equal(gathered[static_cast<std::size_t>(r)], reduced[0]);
    }
  }
}

TEST(transport_ring_share, shares_tile_the_data_and_each_member_owns_one) {
  for (int size : {1, 2, 3, 7})
    for (std::int64_t n : {0, 1, 6, 1001}) {
      std::int64_t next = 0;
      std::set<int> owned;
      for (int c = 0; c < size; ++c) {
        const auto s = ring_share_of(n, c, size);
        EXPECT_EQ(s.begin, next);
        EXPECT_LE(s.length, n / size + 1);
        next += s.length;
        owned.insert(owned_share(c, size));
      }
      EXPECT_EQ(next, n);
      EXPECT_EQ(owned.size(), static_cast<std::size_t>(size));
    }
}

INSTANTIATE_TEST_SUITE_P(transport, transport_allreduce,
                         ::testing::Values(1, 2, 3, 5), [](const auto& info) {
                           return std::to_string(info.param) + "_members";
                         });

TEST(transport_allreduce_tags, fields_are_distinct) {
  EXPECT_NE(collective_tag(1, 0, 0, 0), collective_tag(0, 1, 0, 0));
  EXPECT_NE(collective_tag(0, 1, 0, 0), collective_tag(0, 0, 1, 0));
  EXPECT_NE(collective_tag(0, 0, 1, 0), collective_tag(0, 0, 0, 1));
  EXPECT_THROW(collective_tag(0, 4096, 0, 0), internal_error);
}

} // namespace
} // namespace h2::transport
