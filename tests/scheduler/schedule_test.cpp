#include "h2/scheduler/schedule.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/validate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <sstream>
#include <vector>

namespace h2::scheduler {
namespace {

using enum op_kind;
using ops = std::vector<op>;

constexpr schedule_kind all_kinds[] = {schedule_kind::gpipe,
                                       schedule_kind::one_f_one_b};

/// `list` with every op's chunk checked to be `chunk` and then cleared, so
/// the lists below read as they did with one chunk per chip.
ops on_chunk(const ops& list, int chunk) {
  ops out = list;
  for (auto& x : out) {
    EXPECT_EQ(x.chunk, chunk) << x;
    x.chunk = 0;
  }
  return out;
}

/// Executes `sc` with every chunk's forward taking `forward_seconds`, its
/// fused backward `backward_seconds`, B `input_seconds` and W
/// `weight_seconds`, transfers free; a recv completes at max(own clock, the
/// matching send's time). An execution independent of the simulator.
/// Returns the step time (the largest chip clock at the end).
double step_seconds(const schedule& sc, double forward_seconds,
                    double backward_seconds, double input_seconds = 0,
                    double weight_seconds = 0) {
  const auto p = static_cast<size_t>(sc.chips());
  const auto m = static_cast<size_t>(sc.micro_batches);
  const auto c = static_cast<size_t>(sc.chunks());
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0.0);
  // [chunk][mb]; < 0: not sent yet.
  std::vector<std::vector<double>> sent_fwd(c, std::vector<double>(m, -1));
  std::vector<std::vector<double>> sent_bwd(c, std::vector<double>(m, -1));
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < p; ++s) {
      for (; next[s] < sc.ops[s].size(); ++next[s], progress = true) {
        const op x = sc.ops[s][next[s]];
        const auto i = static_cast<size_t>(x.micro_batch);
        const auto k = static_cast<size_t>(x.chunk);
        if ((x.kind == recv_forward && sent_fwd[k - 1][i] < 0) ||
            (x.kind == recv_backward && sent_bwd[k + 1][i] < 0))
          break; // blocked until the neighbour sends
        switch (x.kind) {
          case recv_forward:
            clock[s] = std::max(clock[s], sent_fwd[k - 1][i]);
            break;
          case recv_backward:
            clock[s] = std::max(clock[s], sent_bwd[k + 1][i]);
            break;
          case forward:
            clock[s] += forward_seconds;
            break;
          case backward:
            clock[s] += backward_seconds;
            break;
          case backward_input:
            clock[s] += input_seconds;
            break;
          case backward_weight:
            clock[s] += weight_seconds;
            break;
          case send_forward:
            sent_fwd[k][i] = clock[s];
            break;
          case send_backward:
            sent_bwd[k][i] = clock[s];
            break;
        }
      }
    }
  }
  for (size_t s = 0; s < p; ++s)
    EXPECT_EQ(next[s], sc.ops[s].size()) << "chip " << s << " stuck";
  return *std::max_element(clock.begin(), clock.end());
}

TEST(scheduler_schedule, op_kind_names) {
  EXPECT_EQ(to_string(recv_forward), "recv_forward");
  EXPECT_EQ(to_string(forward), "forward");
  EXPECT_EQ(to_string(send_forward), "send_forward");
  EXPECT_EQ(to_string(recv_backward), "recv_backward");
  EXPECT_EQ(to_string(backward), "backward");
  EXPECT_EQ(to_string(send_backward), "send_backward");
  EXPECT_EQ(to_string(backward_input), "backward_input");
  EXPECT_EQ(to_string(backward_weight), "backward_weight");
  std::ostringstream out;
  out << op{send_backward, 7} << " " << op{backward_weight, 2, 5};
  EXPECT_EQ(out.str(), "send_backward(7) backward_weight(c5, 2)");
  EXPECT_TRUE(is_compute(backward_weight));
  EXPECT_FALSE(is_compute(recv_forward));
}

TEST(scheduler_schedule, gpipe_2x3_by_hand) {
  auto sc = make_schedule(schedule_kind::gpipe, 2, 3);
  EXPECT_EQ(sc.kind, schedule_kind::gpipe);
  EXPECT_EQ(sc.chips(), 2);
  EXPECT_EQ(sc.micro_batches, 3);
  EXPECT_FALSE(sc.forward_only);
  ASSERT_EQ(sc.ops.size(), 2u);
  EXPECT_EQ(on_chunk(sc.ops[0], 0), (ops{{forward, 0},
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
  EXPECT_EQ(on_chunk(sc.ops[1], 1), (ops{{recv_forward, 0},
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
  EXPECT_EQ(on_chunk(sc.ops[0], 0), (ops{
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
  EXPECT_EQ(on_chunk(sc.ops[2], 2), (ops{
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
  EXPECT_EQ(on_chunk(sc.ops[3], 3), (ops{
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
  EXPECT_EQ(on_chunk(sc.ops[0], 0), (ops{{forward, 0},
                                         {send_forward, 0},
                                         {forward, 1},
                                         {send_forward, 1},
                                         {recv_backward, 0},
                                         {backward, 0},
                                         {recv_backward, 1},
                                         {backward, 1}}));
  // Stage 2: warm-up 1, one steady pair, one cool-down backward.
  EXPECT_EQ(on_chunk(sc.ops[2], 2), (ops{{recv_forward, 0},
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
  EXPECT_EQ(sc.chips(), 3);
  EXPECT_EQ(sc.micro_batches, 2);
  ASSERT_EQ(sc.ops.size(), 3u);
  EXPECT_EQ(
    on_chunk(sc.ops[0], 0),
    (ops{{forward, 0}, {send_forward, 0}, {forward, 1}, {send_forward, 1}}));
  EXPECT_EQ(on_chunk(sc.ops[1], 1), (ops{{recv_forward, 0},
                                         {forward, 0},
                                         {send_forward, 0},
                                         {recv_forward, 1},
                                         {forward, 1},
                                         {send_forward, 1}}));
  EXPECT_EQ(
    on_chunk(sc.ops[2], 2),
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
// leaves exactly the idle share theoretical_bubble() predicts, for both
// kinds.
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
        EXPECT_NEAR(1 - busy / step, theoretical_bubble(kind, p, m), 1e-12);
      }
    }
  }
}

/// The compute ops of `list`, in order.
ops compute_only(const ops& list) {
  ops out;
  for (const auto& x : list)
    if (is_compute(x.kind))
      out.push_back(x);
  return out;
}

TEST(scheduler_schedule, layouts) {
  EXPECT_EQ(pipeline_layout::one_per_chip(3).chunk_chip,
            (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(pipeline_layout::dealt({2, 2, 2}).chunk_chip,
            (std::vector<int>{0, 1, 2, 0, 1, 2}));
  // Chips with more chunks get them in later rounds.
  EXPECT_EQ(pipeline_layout::dealt({2, 1, 3}).chunk_chip,
            (std::vector<int>{0, 1, 2, 0, 2, 2}));
  auto l = pipeline_layout::dealt({1, 2});
  EXPECT_EQ(l.chunk_chip, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(l.chunks_of(1), 2);
  EXPECT_FALSE(l.one_chunk_per_chip());
  EXPECT_TRUE(pipeline_layout::dealt({1, 1}).one_chunk_per_chip());
  EXPECT_THROW(pipeline_layout::dealt({}), internal_error);
  EXPECT_THROW(pipeline_layout::dealt({1, 0}), internal_error);
}

TEST(scheduler_schedule, layout_problems_name_the_reason) {
  auto two = pipeline_layout::dealt({2, 2});
  EXPECT_EQ(layout_problem(schedule_kind::interleaved_1f1b, two, 4), "");
  EXPECT_NE(layout_problem(schedule_kind::one_f_one_b, two, 4)
              .find("1f1b runs one chunk per chip"),
            std::string::npos);
  EXPECT_NE(layout_problem(schedule_kind::interleaved_1f1b,
                           pipeline_layout::one_per_chip(2), 4)
              .find("the same number (at least 2) of chunks"),
            std::string::npos);
  EXPECT_NE(layout_problem(schedule_kind::interleaved_1f1b,
                           pipeline_layout::dealt({2, 3}), 4)
              .find("the same number"),
            std::string::npos);
  EXPECT_NE(layout_problem(schedule_kind::interleaved_1f1b, two, 1)
              .find("at least as many micro-batches as chips (1 < 2)"),
            std::string::npos);
  EXPECT_THROW(make_schedule(schedule_kind::zb_h1, two, 4), internal_error);
}

// Communication is derived only between chips: chunks 1 and 2 of chip 1
// hand over on the chip.
TEST(scheduler_schedule, no_communication_between_chunks_of_one_chip) {
  auto sc = make_forward_schedule(pipeline_layout::dealt({1, 2}), 2);
  ASSERT_NO_THROW(validate(sc));
  EXPECT_EQ(sc.ops[0], (ops{{forward, 0, 0},
                            {send_forward, 0, 0},
                            {forward, 1, 0},
                            {send_forward, 1, 0}}));
  EXPECT_EQ(sc.ops[1], (ops{{recv_forward, 0, 1},
                            {forward, 0, 1},
                            {forward, 0, 2},
                            {recv_forward, 1, 1},
                            {forward, 1, 1},
                            {forward, 1, 2}}));
}

// Megatron-LM's interleaved order, p = 2, v = 2, m = 4, derived by hand
// from its schedule table ((0,c0) (1,c0) (0,c1) (1,c1) (2,c0) ...) and
// warm-ups of (p - s - 1) x 2 + (v - 1) x p: 4 on chip 0, 2 on chip 1.
// Chunk j of chip s is chunk j x p + s of the pipeline.
TEST(scheduler_schedule, interleaved_2x4_v2_by_hand) {
  auto sc = make_schedule(schedule_kind::interleaved_1f1b,
                          pipeline_layout::dealt({2, 2}), 4);
  ASSERT_NO_THROW(validate(sc));
  EXPECT_EQ(compute_only(sc.ops[0]), (ops{{forward, 0, 0},
                                          {forward, 1, 0},
                                          {forward, 0, 2},
                                          {forward, 1, 2},
                                          {forward, 2, 0},
                                          {backward, 0, 2},
                                          {forward, 3, 0},
                                          {backward, 1, 2},
                                          {forward, 2, 2},
                                          {backward, 0, 0},
                                          {forward, 3, 2},
                                          {backward, 1, 0},
                                          {backward, 2, 2},
                                          {backward, 3, 2},
                                          {backward, 2, 0},
                                          {backward, 3, 0}}));
  EXPECT_EQ(compute_only(sc.ops[1]), (ops{{forward, 0, 1},
                                          {forward, 1, 1},
                                          {forward, 0, 3},
                                          {backward, 0, 3},
                                          {forward, 1, 3},
                                          {backward, 1, 3},
                                          {forward, 2, 1},
                                          {backward, 0, 1},
                                          {forward, 3, 1},
                                          {backward, 1, 1},
                                          {forward, 2, 3},
                                          {backward, 2, 3},
                                          {forward, 3, 3},
                                          {backward, 3, 3},
                                          {backward, 2, 1},
                                          {backward, 3, 1}}));
  EXPECT_EQ(in_flight_bound(schedule_kind::interleaved_1f1b,
                            pipeline_layout::dealt({2, 2}), 0, 4),
            5);
}

// ZB-H1, p = 2, m = 2, equal F, B and W: chip 1 runs its B as early as
// 1F1B and defers its W to the end; chip 0 fills its wait for B(1) with
// W(0).
TEST(scheduler_schedule, zb_h1_2x2_by_hand) {
  auto sc = make_schedule(schedule_kind::zb_h1, 2, 2);
  EXPECT_EQ(compute_only(sc.ops[0]), (ops{{forward, 0, 0},
                                          {forward, 1, 0},
                                          {backward_input, 0, 0},
                                          {backward_weight, 0, 0},
                                          {backward_input, 1, 0},
                                          {backward_weight, 1, 0}}));
  EXPECT_EQ(compute_only(sc.ops[1]), (ops{{forward, 0, 1},
                                          {backward_input, 0, 1},
                                          {forward, 1, 1},
                                          {backward_input, 1, 1},
                                          {backward_weight, 0, 1},
                                          {backward_weight, 1, 1}}));
  // B sends the input gradients; W sends nothing.
  EXPECT_EQ(sc.ops[1][2], (op{backward_input, 0, 1}));
  EXPECT_EQ(sc.ops[1][3], (op{send_backward, 0, 1}));
  EXPECT_DOUBLE_EQ(step_seconds(sc, 1, 2, 1, 1), 7); // 3 m + p - 1
}

TEST(scheduler_schedule, zb_h1_invariants_and_theory) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SCOPED_TRACE(testing::Message() << "zb-h1 " << p << "x" << m);
      auto sc = make_schedule(schedule_kind::zb_h1, p, m);
      ASSERT_NO_THROW(validate(sc));
      for (int s = 0; s < p; ++s) {
        const size_t per_mb = 3u + (s > 0 ? 2u : 0u) + (s < p - 1 ? 2u : 0u);
        EXPECT_EQ(sc.ops[s].size(), per_mb * m) << "chip " << s;
        EXPECT_LE(peak_in_flight(sc, s),
                  in_flight_bound(schedule_kind::zb_h1, p, s, m));
      }
      // 1F1B's peak: the first chip holds min(p, m) either way.
      EXPECT_EQ(peak_in_flight(sc, 0), std::min(p, m));
      if (m < p)
        continue; // the paper's bubble assumes m >= p
      const double step = step_seconds(sc, 1, 2, 1, 1);
      EXPECT_DOUBLE_EQ(step, 3 * m + p - 1);
      EXPECT_NEAR(1 - 3.0 * m / step,
                  theoretical_bubble(schedule_kind::zb_h1, p, m), 1e-12);
    }
  }
}

// zb-hetero with equal times is zb-h1; with each chip's own times its lists
// stay valid (the simulator's tests time them).
TEST(scheduler_schedule, zb_hetero_places_w_by_the_chips_times) {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 12; ++m) {
      auto layout = pipeline_layout::one_per_chip(p);
      EXPECT_EQ(make_schedule(schedule_kind::zb_hetero, layout, m).ops,
                make_schedule(schedule_kind::zb_h1, layout, m).ops);
    }
  std::mt19937 g(3);
  std::uniform_real_distribution<double> t(0.2, 3);
  for (int i = 0; i < 200; ++i) {
    const int p = 2 + i % 5, m = 1 + i % 11;
    schedule_times times;
    for (int s = 0; s < p; ++s) {
      times.forward.push_back(t(g));
      times.input.push_back(t(g));
      times.weight.push_back(t(g));
    }
    auto sc = make_schedule(schedule_kind::zb_hetero,
                            pipeline_layout::one_per_chip(p), m, times);
    ASSERT_NO_THROW(validate(sc)) << p << "x" << m;
  }
}

TEST(scheduler_schedule, interleaved_invariants_and_theory) {
  for (int p = 2; p <= 6; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 4 * p + 1; ++m) {
        SCOPED_TRACE(testing::Message()
                     << "interleaved " << p << "x" << m << " v" << v);
        auto layout =
          pipeline_layout::dealt(std::vector<int>(static_cast<size_t>(p), v));
        auto sc = make_schedule(schedule_kind::interleaved_1f1b, layout, m);
        ASSERT_NO_THROW(validate(sc));
        for (int s = 0; s < p; ++s)
          EXPECT_EQ(
            peak_in_flight(sc, s),
            in_flight_bound(schedule_kind::interleaved_1f1b, layout, s, m));
        if (m % p != 0)
          continue; // the textbook value assumes whole groups
        // Each chunk a v-th of a stage: F 1/v, B 2/v.
        const double step = step_seconds(sc, 1.0 / v, 2.0 / v);
        EXPECT_NEAR(step, 3.0 * m + 3.0 * (p - 1) / v, 1e-9);
        EXPECT_NEAR(
          1 - 3.0 * m / step,
          theoretical_bubble(schedule_kind::interleaved_1f1b, p, m, v), 1e-9);
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
  EXPECT_DOUBLE_EQ(theoretical_bubble(schedule_kind::one_f_one_b, 1, 7), 0.0);
  EXPECT_DOUBLE_EQ(theoretical_bubble(schedule_kind::one_f_one_b, 4, 12), 0.2);
  EXPECT_DOUBLE_EQ(theoretical_bubble(schedule_kind::one_f_one_b, 2, 1), 0.5);
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
  EXPECT_THROW(theoretical_bubble(schedule_kind::zb_h1, 2, 2, 0),
               internal_error);
  EXPECT_THROW(make_forward_schedule(0, 1), internal_error);
  EXPECT_THROW(make_forward_schedule(1, 0), internal_error);
  EXPECT_THROW(theoretical_bubble(schedule_kind::one_f_one_b, 0, 1),
               internal_error);
  EXPECT_THROW(theoretical_bubble(schedule_kind::one_f_one_b, 1, 0),
               internal_error);
}

} // namespace
} // namespace h2::scheduler
