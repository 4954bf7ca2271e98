#include "h2/devices/emulated/cost_function.hpp"

#include "h2/core/catalog.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace h2::devices {
namespace {

const chip_profile& a100() {
  const chip_profile* p = catalog::builtin().find("a100-sxm-40gb");
  EXPECT_NE(p, nullptr);
  return *p;
}

/// A small layer whose numbers are easy to follow by hand.
layer_work small_work() {
  layer_work w;
  w.kind = layer_kind::block;
  w.rows = 64;
  w.forward_flops = 2e12;
  w.backward_flops = 4e12;
  w.forward_bytes = 1e9;
  w.backward_bytes = 1e12; // memory-bound backward
  w.parameters = 1000;
  return w;
}

TEST(devices_cost_function, layer_seconds_is_a_roofline) {
  const double time_scale = 3;
  emulated_cost_function cost(a100(), dtype::bf16, time_scale);
  // a100-sxm-40gb: 312 bf16 TFLOP/s, 1555 GB/s, max_efficiency 0.70 at
  // half_efficiency_rows 192, 15 us per op (core/data/catalog.toml).
  const double efficiency = 0.70 * 64 / (64 + 192.0);
  const double fwd_compute = 2e12 / (312e12 * efficiency);
  const double fwd_memory = 1e9 / 1555e9;
  ASSERT_GT(fwd_compute, fwd_memory); // compute-bound forward
  EXPECT_DOUBLE_EQ(cost.layer_seconds(small_work(), pass::forward),
                   time_scale * (15e-6 + fwd_compute));
  const double bwd_compute = 4e12 / (312e12 * efficiency);
  const double bwd_memory = 1e12 / 1555e9;
  ASSERT_GT(bwd_memory, bwd_compute); // memory-bound backward
  EXPECT_DOUBLE_EQ(cost.layer_seconds(small_work(), pass::backward),
                   time_scale * (15e-6 + bwd_memory));
}

TEST(devices_cost_function, overhead_scale_scales_fixed_costs_only) {
  emulated_cost_function cost(a100(), dtype::bf16, 2, 0.1);
  const double efficiency = 0.70 * 64 / (64 + 192.0);
  EXPECT_DOUBLE_EQ(cost.layer_seconds(small_work(), pass::forward),
                   2 * (0.1 * 15e-6 + 2e12 / (312e12 * efficiency)));
  EXPECT_DOUBLE_EQ(cost.optimizer_seconds(1000),
                   2 * (0.1 * 15e-6 + 28.0 * 1000 / 1555e9));
  // The profile's link latency scales; an explicit override does not.
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(300, 300e9, 0, -1),
                   2 * (0.1 * 5e-6 + 300 / 300e9));
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(300, 300e9, 0, 1e-6),
                   2 * (1e-6 + 300 / 300e9));
}

TEST(devices_cost_function, dtype_selects_the_peak) {
  emulated_cost_function fp32(a100(), dtype::fp32, 1);
  layer_work w = small_work();
  const double efficiency = 0.70 * 64 / (64 + 192.0);
  EXPECT_DOUBLE_EQ(fp32.layer_seconds(w, pass::forward),
                   15e-6 + 2e12 / (19.5e12 * efficiency));
  // More rows run closer to peak.
  w.rows = 192;
  EXPECT_DOUBLE_EQ(fp32.layer_seconds(w, pass::forward),
                   15e-6 + 2e12 / (19.5e12 * 0.35));
}

TEST(devices_cost_function, optimizer_seconds_reads_and_writes_state) {
  emulated_cost_function cost(a100(), dtype::bf16, 2);
  EXPECT_DOUBLE_EQ(cost.optimizer_seconds(1'000'000),
                   2 * (15e-6 + 7 * 4 * 1e6 / 1555e9));
}

TEST(devices_cost_function, transfer_seconds) {
  emulated_cost_function cost(a100(), dtype::bf16, 3);
  const std::uint64_t bytes = 1'000'000;
  // The slower end (here the peer, 100 GB/s) plus the profile's 5 us.
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(bytes, 100e9, 0, -1),
                   3 * (5e-6 + 1e6 / 100e9));
  // A faster peer: the A100's own 300 GB/s decide.
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(bytes, 900e9, 0, -1),
                   3 * (5e-6 + 1e6 / 300e9));
  // Overrides of bandwidth and latency.
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(bytes, 100e9, 1e9, 1e-3),
                   3 * (1e-3 + 1e6 / 1e9));
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(bytes, 100e9, 0, 0),
                   3 * (1e6 / 100e9));
  // Infinite bandwidth: latency only.
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(bytes, 100e9, inf, 2e-6), 3 * 2e-6);
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(bytes, 100e9, inf, -1), 3 * 5e-6);
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(0, 100e9, 0, -1), 3 * 5e-6);
}

} // namespace
} // namespace h2::devices
