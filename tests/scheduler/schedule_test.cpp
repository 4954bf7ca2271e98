#include "h2/scheduler/schedule.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/validate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <vector>

namespace h2::scheduler {
namespace {

using enum op_kind;
using ops = std::vector<op>;

constexpr schedule_kind all_kinds[] = {schedule_kind::gpipe,
                                       schedule_kind::one_f_one_b};

/// Executes `sc` with every forward taking `forward_seconds` and every
/// backward `backward_seconds` on every stage, transfers free; a recv
/// completes at max(own clock, the matching send's time). Returns the step
/// time (the largest stage clock at the end).
double step_seconds(const schedule& sc, double forward_seconds,
                    double backward_seconds) {
  const auto p = static_cast<size_t>(sc.stages);
  const auto m = static_cast<size_t>(sc.micro_batches);
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  // < 0: not sent yet.
  std::vector<std::vector<double>> sent_fwd(p, std::vector<double>(m, -1));
  std::vector<std::vector<double>> sent_bwd(p, std::vector<double>(m, -1));
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < p; ++s) {
      for (; next[s] < sc.ops[s].size(); ++next[s], progress = true) {
        const op x = sc.ops[s][next[s]];
        const auto i = static_cast<size_t>(x.micro_batch);
        if ((x.kind == recv_forward && sent_fwd[s - 1][i] < 0) ||
            (x.kind == recv_backward && sent_bwd[s + 1][i] < 0))
          break; // blocked until the neighbour sends
        switch (x.kind) {
          case recv_forward:
            clock[s] = std::max(clock[s], sent_fwd[s - 1][i]);
            break;
          case recv_backward:
            clock[s] = std::max(clock[s], sent_bwd[s + 1][i]);
            break;
          case forward:
            clock[s] += forward_seconds;
            break;
          case backward:
            clock[s] += backward_seconds;
            break;
          case send_forward:
            sent_fwd[s][i] = clock[s];
            break;
          case send_backward:
            sent_bwd[s][i] = clock[s];
            break;
        }
      }
    }
  }
  for (size_t s = 0; s < p; ++s)
    EXPECT_EQ(next[s], sc.ops[s].size()) << "stage " << s << " stuck";
  return *std::max_element(clock.begin(), clock.end());
}

TEST(scheduler_schedule, op_kind_names) {
  EXPECT_EQ(to_string(recv_forward), "recv_forward");
  EXPECT_EQ(to_string(forward), "forward");
  EXPECT_EQ(to_string(send_forward), "send_forward");
  EXPECT_EQ(to_string(recv_backward), "recv_backward");
  EXPECT_EQ(to_string(backward), "backward");
  EXPECT_EQ(to_string(send_backward), "send_backward");
  std::ostringstream out;
  out << op{send_backward, 7};
  EXPECT_EQ(out.str(), "send_backward(7)");
}

TEST(scheduler_schedule, gpipe_2x3_by_hand) {
  auto sc = make_schedule(schedule_kind::gpipe, 2, 3);
  EXPECT_EQ(sc.kind, schedule_kind::gpipe);
  EXPECT_EQ(sc.stages, 2);
  EXPECT_EQ(sc.micro_batches, 3);
  EXPECT_FALSE(sc.forward_only);
  ASSERT_EQ(sc.ops.size(), 2u);
  EXPECT_EQ(sc.ops[0], (ops{{forward, 0},
                            {send_forward, 0},
                            {forward, 1},
                            {send_forward, 1},
                            {forward, 2},
                            {send_forward, 2},
                            {recv_backward, 0},
                            {backward, 0},
                            {recv_backward, 1},
                            {backward, 1},
                            {recv_backward, 2},
                            {backward, 2}}));
  EXPECT_EQ(sc.ops[1], (ops{{recv_forward, 0},
                            {forward, 0},
                            {recv_forward, 1},
                            {forward, 1},
                            {recv_forward, 2},
                            {forward, 2},
                            {backward, 0},
                            {send_backward, 0},
                            {backward, 1},
                            {send_backward, 1},
                            {backward, 2},
                            {send_backward, 2}}));
}

TEST(scheduler_schedule, one_f_one_b_4x6_by_hand) {
  auto sc = make_schedule(schedule_kind::one_f_one_b, 4, 6);
  EXPECT_EQ(sc.kind, schedule_kind::one_f_one_b);
  ASSERT_EQ(sc.ops.size(), 4u);
  // One line per forward or backward with its recv/send; laid out by hand.
  // clang-format off
  // Stage 0: 3 warm-up forwards, 3 x (forward, backward), 3 cool-down
  // backwards.
  EXPECT_EQ(sc.ops[0], (ops{
    {forward, 0}, {send_forward, 0},
    {forward, 1}, {send_forward, 1},
    {forward, 2}, {send_forward, 2},
    {forward, 3}, {send_forward, 3},
    {recv_backward, 0}, {backward, 0},
    {forward, 4}, {send_forward, 4},
    {recv_backward, 1}, {backward, 1},
    {forward, 5}, {send_forward, 5},
    {recv_backward, 2}, {backward, 2},
    {recv_backward, 3}, {backward, 3},
    {recv_backward, 4}, {backward, 4},
    {recv_backward, 5}, {backward, 5}}));
  // Stage 2: 1 warm-up forward, 5 x (forward, backward), 1 cool-down
  // backward.
  EXPECT_EQ(sc.ops[2], (ops{
    {recv_forward, 0}, {forward, 0}, {send_forward, 0},
    {recv_forward, 1}, {forward, 1}, {send_forward, 1},
    {recv_backward, 0}, {backward, 0}, {send_backward, 0},
    {recv_forward, 2}, {forward, 2}, {send_forward, 2},
    {recv_backward, 1}, {backward, 1}, {send_backward, 1},
    {recv_forward, 3}, {forward, 3}, {send_forward, 3},
    {recv_backward, 2}, {backward, 2}, {send_backward, 2},
    {recv_forward, 4}, {forward, 4}, {send_forward, 4},
    {recv_backward, 3}, {backward, 3}, {send_backward, 3},
    {recv_forward, 5}, {forward, 5}, {send_forward, 5},
    {recv_backward, 4}, {backward, 4}, {send_backward, 4},
    {recv_backward, 5}, {backward, 5}, {send_backward, 5}}));
  // Stage 3 (last): no warm-up, strict alternation; the loss is inside
  // forward, so no send_forward / recv_backward.
  EXPECT_EQ(sc.ops[3], (ops{
    {recv_forward, 0}, {forward, 0},
    {backward, 0}, {send_backward, 0},
    {recv_forward, 1}, {forward, 1},
    {backward, 1}, {send_backward, 1},
    {recv_forward, 2}, {forward, 2},
    {backward, 2}, {send_backward, 2},
    {recv_forward, 3}, {forward, 3},
    {backward, 3}, {send_backward, 3},
    {recv_forward, 4}, {forward, 4},
    {backward, 4}, {send_backward, 4},
    {recv_forward, 5}, {forward, 5},
    {backward, 5}, {send_backward, 5}}));
  // clang-format on
}

TEST(scheduler_schedule, one_f_one_b_with_fewer_micro_batches_than_stages) {
  // Warm-up min(3, 2) = 2 on stage 0: it forwards everything first.
  auto sc = make_schedule(schedule_kind::one_f_one_b, 4, 2);
  EXPECT_EQ(sc.ops[0], (ops{{forward, 0},
                            {send_forward, 0},
                            {forward, 1},
                            {send_forward, 1},
                            {recv_backward, 0},
                            {backward, 0},
                            {recv_backward, 1},
                            {backward, 1}}));
  // Stage 2: warm-up 1, one steady pair, one cool-down backward.
  EXPECT_EQ(sc.ops[2], (ops{{recv_forward, 0},
                            {forward, 0},
                            {send_forward, 0},
                            {recv_forward, 1},
                            {forward, 1},
                            {send_forward, 1},
                            {recv_backward, 0},
                            {backward, 0},
                            {send_backward, 0},
                            {recv_backward, 1},
                            {backward, 1},
                            {send_backward, 1}}));
}

TEST(scheduler_schedule, one_stage_degenerates) {
  auto one_f_one_b = make_schedule(schedule_kind::one_f_one_b, 1, 3);
  ASSERT_EQ(one_f_one_b.ops.size(), 1u);
  EXPECT_EQ(one_f_one_b.ops[0], (ops{{forward, 0},
                                     {backward, 0},
                                     {forward, 1},
                                     {backward, 1},
                                     {forward, 2},
                                     {backward, 2}}));
  auto gpipe = make_schedule(schedule_kind::gpipe, 1, 3);
  ASSERT_EQ(gpipe.ops.size(), 1u);
  EXPECT_EQ(gpipe.ops[0], (ops{{forward, 0},
                               {forward, 1},
                               {forward, 2},
                               {backward, 0},
                               {backward, 1},
                               {backward, 2}}));
}

TEST(scheduler_schedule, forward_only_3x2_by_hand) {
  auto sc = make_forward_schedule(3, 2);
  EXPECT_EQ(sc.kind, schedule_kind::gpipe);
  EXPECT_TRUE(sc.forward_only);
  EXPECT_EQ(sc.stages, 3);
  EXPECT_EQ(sc.micro_batches, 2);
  ASSERT_EQ(sc.ops.size(), 3u);
  EXPECT_EQ(
    sc.ops[0],
    (ops{{forward, 0}, {send_forward, 0}, {forward, 1}, {send_forward, 1}}));
  EXPECT_EQ(sc.ops[1], (ops{{recv_forward, 0},
                            {forward, 0},
                            {send_forward, 0},
                            {recv_forward, 1},
                            {forward, 1},
                            {send_forward, 1}}));
  EXPECT_EQ(
    sc.ops[2],
    (ops{{recv_forward, 0}, {forward, 0}, {recv_forward, 1}, {forward, 1}}));
}

// Every shape up to 8 stages x 32 micro-batches: the generated lists pass
// validate(), have the expected length, and reach the activation bound
// exactly (the bound is tight, not just respected).
TEST(scheduler_schedule, invariants_for_every_shape) {
  for (auto kind : all_kinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 32; ++m) {
        SCOPED_TRACE(testing::Message()
                     << to_string(kind) << " " << p << "x" << m);
        auto sc = make_schedule(kind, p, m);
        ASSERT_NO_THROW(validate(sc));
        for (int s = 0; s < p; ++s) {
          const size_t per_mb = 2u + (s > 0 ? 2u : 0u) + (s < p - 1 ? 2u : 0u);
          EXPECT_EQ(sc.ops[s].size(), per_mb * m) << "stage " << s;
          EXPECT_EQ(peak_in_flight(sc, s), in_flight_bound(kind, p, s, m))
            << "stage " << s;
        }
      }
    }
  }
}

TEST(scheduler_schedule, forward_only_invariants_for_every_shape) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE(testing::Message() << p << "x" << m);
      auto sc = make_forward_schedule(p, m);
      ASSERT_NO_THROW(validate(sc));
      for (int s = 0; s < p; ++s) {
        const size_t per_mb = 1u + (s > 0 ? 1u : 0u) + (s < p - 1 ? 1u : 0u);
        EXPECT_EQ(sc.ops[s].size(), per_mb * m) << "stage " << s;
        EXPECT_EQ(peak_in_flight(sc, s),
                  in_flight_bound(schedule_kind::gpipe, p, s, m))
          << "stage " << s;
      }
    }
  }
}

// Executing the lists with equal stage times (backward twice the forward)
// leaves exactly the idle share bubble_fraction() predicts, for both kinds.
TEST(scheduler_schedule, timed_run_matches_bubble_fraction) {
  const double forward_seconds = 1;
  const double backward_seconds = 2;
  for (auto kind : all_kinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 32; ++m) {
        SCOPED_TRACE(testing::Message()
                     << to_string(kind) << " " << p << "x" << m);
        auto sc = make_schedule(kind, p, m);
        const double busy = m * (forward_seconds + backward_seconds);
        const double step = step_seconds(sc, forward_seconds, backward_seconds);
        EXPECT_DOUBLE_EQ(step,
                         (m + p - 1) * (forward_seconds + backward_seconds));
        // 1 - x rounds, so compare the fractions to a few ulps of 1.
        EXPECT_NEAR(1 - busy / step, bubble_fraction(p, m), 1e-12);
      }
    }
  }
}

TEST(scheduler_schedule, in_flight_bound_values) {
  EXPECT_EQ(in_flight_bound(schedule_kind::gpipe, 4, 0, 6), 6);
  EXPECT_EQ(in_flight_bound(schedule_kind::gpipe, 4, 3, 6), 6);
  EXPECT_EQ(in_flight_bound(schedule_kind::one_f_one_b, 4, 0, 6), 4);
  EXPECT_EQ(in_flight_bound(schedule_kind::one_f_one_b, 4, 3, 6), 1);
  EXPECT_EQ(in_flight_bound(schedule_kind::one_f_one_b, 8, 0, 2), 2);
  EXPECT_EQ(in_flight_bound(schedule_kind::one_f_one_b, 1, 0, 5), 1);
}

TEST(scheduler_schedule, bubble_fraction_values) {
  EXPECT_DOUBLE_EQ(bubble_fraction(1, 7), 0.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 12), 0.2);
  EXPECT_DOUBLE_EQ(bubble_fraction(2, 1), 0.5);
}

TEST(scheduler_schedule, rejects_bad_arguments) {
  for (auto kind : all_kinds) {
    EXPECT_THROW(make_schedule(kind, 0, 4), internal_error);
    EXPECT_THROW(make_schedule(kind, -1, 4), internal_error);
    EXPECT_THROW(make_schedule(kind, 4, 0), internal_error);
    EXPECT_THROW(in_flight_bound(kind, 4, 4, 6), internal_error);
    EXPECT_THROW(in_flight_bound(kind, 4, -1, 6), internal_error);
    EXPECT_THROW(in_flight_bound(kind, 0, 0, 6), internal_error);
  }
  EXPECT_THROW(make_schedule(static_cast<schedule_kind>(42), 2, 2),
               internal_error);
  EXPECT_THROW(make_forward_schedule(0, 1), internal_error);
  EXPECT_THROW(make_forward_schedule(1, 0), internal_error);
  EXPECT_THROW(bubble_fraction(0, 1), internal_error);
  EXPECT_THROW(bubble_fraction(1, 0), internal_error);
}

} // namespace
} // namespace h2::scheduler
