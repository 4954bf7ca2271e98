// summarize_step, grad_norm_of, virtual_phase_end: pure arithmetic.
#include "h2/core/error.hpp"
#include "h2/runtime/step_summary.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace h2::runtime {
namespace {

chip_step_report report(int stage, int first_layer, double start, double end,
                        double fwd, double bwd, std::vector<double> norms) {
  chip_step_report r;
  r.chip = {0, stage};
  r.stage = stage;
  r.first_layer = first_layer;
  r.start = {start, 100 + start};
  r.phase_end = {end, 100 + end};
  r.forward_seconds = fwd;
  r.backward_seconds = bwd;
  for (std::size_t i = 0; i < norms.size(); ++i)
    r.layer_ids.push_back(first_layer + static_cast<int>(i));
  r.layer_squared_norms = std::move(norms);
  return r;
}

chip_update_report update(int stage, double end) {
  chip_update_report u;
  u.chip = {0, stage};
  u.optimizer_seconds = 0.5;
  u.end = {end, 100 + end};
  return u;
}

TEST(runtime_step_summary, step_time_bubble_and_loss) {
  auto a = report(0, 0, 10, 18, 2, 4, {1, 4});
  auto b = report(1, 2, 10, 19, 3, 3, {4});
  b.loss = 2.5;
  auto s = summarize_step(3, clock_mode::virtual_clock, 1000, 0.1, 3.0, 0.5,
                          {b, a}, {update(0, 19.5), update(1, 19.5)});
  EXPECT_EQ(s.step, 3);
  EXPECT_DOUBLE_EQ(s.loss, 2.5);
  EXPECT_DOUBLE_EQ(s.step_seconds, 9.5);
  EXPECT_DOUBLE_EQ(s.pipeline_seconds, 9);
  // busy 6 + 6 of 2 chips x 9 s
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 1.0 - 12.0 / 18.0);
  EXPECT_DOUBLE_EQ(s.tokens_per_second, 1000 / 9.5);
  ASSERT_EQ(s.chips.size(), 2u);
  EXPECT_EQ(s.chips[0].chip, (chip_id{0, 0})); // sorted by chip id
  EXPECT_DOUBLE_EQ(s.chips[0].idle_seconds, 3);
  EXPECT_DOUBLE_EQ(s.chips[1].idle_seconds, 3);
  EXPECT_DOUBLE_EQ(s.virtual_end, 19.5);
  // The wall clock reads the other half of each clock pair.
  auto w = summarize_step(3, clock_mode::wall, 1000, 0.1, 3.0, 0.5, {a, b},
                          {update(0, 19.5), update(1, 19.5)});
  EXPECT_DOUBLE_EQ(w.step_seconds, 9.5);
  EXPECT_DOUBLE_EQ(w.wall_step_seconds, 9.5);
}

TEST(runtime_step_summary, grad_norm_sums_layers_in_order) {
  auto a = report(0, 0, 0, 1, 0, 0, {1, 4});
  auto b = report(1, 2, 0, 1, 0, 0, {4});
  EXPECT_DOUBLE_EQ(grad_norm_of({b, a}), 3.0);
  EXPECT_DOUBLE_EQ(virtual_phase_end({a, b}), 1.0);
}

TEST(runtime_step_summary, missing_update_report_is_an_invariant_violation) {
  auto a = report(0, 0, 0, 1, 0, 0, {});
  EXPECT_THROW(summarize_step(0, clock_mode::virtual_clock, 1, 0, 0, 1, {a},
                              {update(5, 1)}),
               internal_error);
}

} // namespace
} // namespace h2::runtime
