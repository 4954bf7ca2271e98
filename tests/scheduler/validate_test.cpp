#include "h2/scheduler/validate.hpp"

#include "h2/core/error.hpp"

#include <gtest/gtest.h>

#include <random>

#include <algorithm>
#include <string>
#include <vector>

namespace h2::scheduler {
namespace {

using enum op_kind;

/// Expects validate(sc) to throw h2::internal_error whose message contains
/// `needle`, so a schedule rejected for another reason than the one under
/// test fails the test.
void expect_rejected(const schedule& sc, const std::string& needle) {
  try {
    validate(sc);
    ADD_FAILURE() << "validate() accepted the schedule; expected: " << needle;
  } catch (const internal_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
      << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

/// Removes every op of `chip` for which `pred` holds.
template <class Pred>
void erase_ops(schedule& sc, int chip, Pred pred) {
  auto& list = sc.ops[chip];
  list.erase(std::remove_if(list.begin(), list.end(), pred), list.end());
}

/// Index of `x` in chip `chip`'s list.
std::ptrdiff_t index_of(const schedule& sc, int chip, op x) {
  const auto& list = sc.ops[chip];
  auto it = std::find(list.begin(), list.end(), x);
  EXPECT_NE(it, list.end()) << x << " not in chip " << chip;
  return it - list.begin();
}

TEST(scheduler_validate, accepts_generated_schedules) {
  for (auto kind :
       {schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zb_h1})
    EXPECT_NO_THROW(validate(make_schedule(kind, 3, 5)));
  EXPECT_NO_THROW(validate(make_schedule(
    schedule_kind::interleaved_1f1b, pipeline_layout::dealt({2, 2, 2}), 5)));
  EXPECT_NO_THROW(validate(make_forward_schedule(3, 5)));
}

// zb-hetero on chips holding different numbers of chunks: the greedy run's
// lists validate (no deadlock, the memory bound, W after B) and every chunk
// runs its W in micro-batch order (the single chip's order of gradients).
TEST(scheduler_validate, accepts_zb_hetero_on_uneven_layouts) {
  std::mt19937_64 g(5);
  std::uniform_real_distribution<double> t(0.3, 3);
  std::uniform_int_distribution<int> count(1, 3);
  for (int i = 0; i < 300; ++i) {
    const int p = 2 + i % 4, m = 1 + i % 9;
    std::vector<int> counts;
    for (int k = 0; k < p; ++k)
      counts.push_back(count(g));
    const auto layout = pipeline_layout::dealt(counts);
    schedule_times times;
    for (int c = 0; c < layout.chunks(); ++c) {
      times.forward.push_back(t(g));
      times.input.push_back(t(g));
      times.weight.push_back(t(g));
    }
    const auto sc = make_schedule(schedule_kind::zb_hetero, layout, m, times);
    SCOPED_TRACE("case " + std::to_string(i));
    EXPECT_NO_THROW(validate(sc));
    std::vector<int> next_w(static_cast<std::size_t>(layout.chunks()), 0);
    for (const auto& list : sc.ops)
      for (const auto& x : list)
        if (x.kind == op_kind::backward_weight) {
          EXPECT_EQ(x.micro_batch, next_w[static_cast<std::size_t>(x.chunk)]++);
        }
  }
}

TEST(scheduler_validate, rejects_missing_backward) {
  // The whole backward of micro-batch 2 on the middle chip: recv, compute
  // and send all gone.
  auto sc = make_schedule(schedule_kind::one_f_one_b, 3, 4);
  erase_ops(sc, 1, [](const op& x) {
    return x.micro_batch == 2 &&
           (x.kind == recv_backward || x.kind == backward ||
            x.kind == send_backward);
  });
  expect_rejected(sc, "chip 1, op 21 (end of list), chunk 1, micro-batch 2: "
                      "never backwarded");
}

TEST(scheduler_validate, rejects_backward_compute_without_its_recv_and_send) {
  auto sc = make_schedule(schedule_kind::gpipe, 3, 4);
  erase_ops(sc, 1, [](const op& x) { return x == op{backward, 0, 1}; });
  expect_rejected(sc, "chip 1, op 12 (recv_backward(c1, 0)), chunk 1, "
                      "micro-batch 0: recv_backward not followed by its "
                      "backward");
}

TEST(scheduler_validate, rejects_missing_forward) {
  auto sc = make_schedule(schedule_kind::gpipe, 1, 3);
  erase_ops(sc, 0, [](const op& x) { return x == op{forward, 2}; });
  // backward(2) now comes without a forward.
  expect_rejected(sc, "micro-batch 2: backward before forward");
}

TEST(scheduler_validate, rejects_backward_before_its_forward) {
  // Last chip of 1F1B 2x2: rf0 F0 B0 sb0 rf1 F1 B1 sb1; move B1 sb1 ahead
  // of rf1 F1.
  auto sc = make_schedule(schedule_kind::one_f_one_b, 2, 2);
  auto& last = sc.ops[1];
  ASSERT_EQ(last[4], (op{recv_forward, 1, 1}));
  std::rotate(last.begin() + 4, last.begin() + 6, last.end());
  ASSERT_EQ(last[4], (op{backward, 1, 1}));
  expect_rejected(sc, "chip 1, op 4 (backward(c1, 1)), chunk 1, micro-batch "
                      "1: backward before forward");
}

TEST(scheduler_validate, rejects_forward_twice) {
  auto sc = make_schedule(schedule_kind::gpipe, 1, 2);
  sc.ops[0][1] = {forward, 0};
  expect_rejected(sc, "chip 0, op 1 (forward(0)), chunk 0, micro-batch 0: "
                      "forwarded twice");
}

TEST(scheduler_validate, rejects_missing_send) {
  // Chip 0 never sends micro-batch 1: chip 1's recv would wait forever.
  auto sc = make_schedule(schedule_kind::gpipe, 2, 2);
  erase_ops(sc, 0, [](const op& x) { return x == op{send_forward, 1}; });
  expect_rejected(sc, "chip 0, op 2 (forward(1)), chunk 0, micro-batch 1: "
                      "forward without send_forward right after it");
}

TEST(scheduler_validate, rejects_recv_on_the_first_chip) {
  auto sc = make_schedule(schedule_kind::gpipe, 2, 2);
  sc.ops[0].insert(sc.ops[0].begin(), op{recv_forward, 0});
  expect_rejected(sc, "chip 0, op 0 (recv_forward(0)), chunk 0, micro-batch "
                      "0: receives activations from no other chip");
}

TEST(scheduler_validate, rejects_send_on_the_last_chip) {
  auto sc = make_schedule(schedule_kind::gpipe, 2, 2);
  auto& last = sc.ops[1];
  last.insert(last.begin() + 2, op{send_forward, 0, 1});
  expect_rejected(sc, "chip 1, op 2 (send_forward(c1, 0)), chunk 1, "
                      "micro-batch 0: sends activations to no other chip");
}

TEST(scheduler_validate, rejects_recv_for_another_micro_batch) {
  auto sc = make_schedule(schedule_kind::gpipe, 2, 2);
  sc.ops[1][0] = {recv_forward, 1, 1};
  expect_rejected(sc, "chip 1, op 0 (recv_forward(c1, 1)), chunk 1, "
                      "micro-batch 1: recv_forward not followed by its "
                      "forward");
}

TEST(scheduler_validate, rejects_a_chunk_sent_to_the_wrong_chip) {
  // Chip 2 sends chunk 0's activations: chunk 0 lives on chip 0.
  auto sc = make_schedule(schedule_kind::gpipe, 3, 2);
  sc.ops[2].insert(sc.ops[2].begin(), op{send_forward, 0, 0});
  expect_rejected(sc, "chip 2, op 0 (send_forward(0)), chunk 0, micro-batch "
                      "0: chunk 0 is held by chip 0, not chip 2");
  // Interleaved: chip 0's forward of chunk 1 (chip 1's).
  sc = make_schedule(schedule_kind::interleaved_1f1b,
                     pipeline_layout::dealt({2, 2}), 2);
  sc.ops[0][0].chunk = 1;
  expect_rejected(sc, "chunk 1 is held by chip 1, not chip 0");
}

TEST(scheduler_validate, rejects_w_before_its_b) {
  auto sc = make_schedule(schedule_kind::zb_h1, 2, 2);
  auto& last = sc.ops[1];
  const auto w0 = index_of(sc, 1, {backward_weight, 0, 1});
  const auto b0 = index_of(sc, 1, {backward_input, 0, 1});
  std::rotate(last.begin() + b0, last.begin() + w0, last.begin() + w0 + 1);
  expect_rejected(sc, "chip 1, op 2 (backward_weight(c1, 0)), chunk 1, "
                      "micro-batch 0: W before its B");
}

TEST(scheduler_validate, rejects_b_without_w_and_split_kinds_mixed_up) {
  auto sc = make_schedule(schedule_kind::zb_h1, 2, 2);
  erase_ops(sc, 0, [](const op& x) { return x == op{backward_weight, 1}; });
  expect_rejected(sc, "chip 0, op 9 (end of list), chunk 0, micro-batch 1: "
                      "B without its W");
  sc = make_schedule(schedule_kind::zb_h1, 2, 2);
  sc.kind = schedule_kind::one_f_one_b;
  expect_rejected(sc, "1f1b runs the fused backward");
  sc = make_schedule(schedule_kind::one_f_one_b, 2, 2);
  sc.kind = schedule_kind::zb_h1;
  expect_rejected(sc, "zb-h1 splits the backward");
}

TEST(scheduler_validate, rejects_deadlock_from_swapped_ops) {
  // 1F1B 3x4 where chip 0 skips its warm-up: it waits for backward(0)
  // before sending forward(1), while chip 1 waits for forward(1) before it
  // can run backward(0). Every per-chip rule and the bound still hold.
  auto sc = make_schedule(schedule_kind::one_f_one_b, 3, 4);
  auto& first = sc.ops[0];
  // forward(1), send_forward(1) at 2..3, then forward(2), send_forward(2),
  // recv_backward(0), backward(0) at 4..7: move backward(0) ahead of both.
  const auto rb0 = index_of(sc, 0, {recv_backward, 0});
  ASSERT_EQ(rb0, 6);
  std::rotate(first.begin() + 2, first.begin() + rb0, first.begin() + rb0 + 2);
  ASSERT_EQ(first[2], (op{recv_backward, 0}));
  expect_rejected(sc, "deadlock");
  expect_rejected(sc, "chip 0, op 2 (recv_backward(0)) waits for "
                      "send_backward(0) of chunk 1 on chip 1");
  expect_rejected(sc, "chip 1, op 3 (recv_forward(c1, 1)) waits for "
                      "send_forward(1) of chunk 0 on chip 0");
}

TEST(scheduler_validate, rejects_cross_chip_cycle) {
  // Chip 0 alternates (needs backward(0) before sending forward(1)), chip 1
  // forwards everything first (needs forward(1) before backward(0)).
  schedule sc{
    schedule_kind::gpipe, pipeline_layout::one_per_chip(2), 2, {}, false};
  sc.ops = {{{forward, 0},
             {send_forward, 0},
             {recv_backward, 0},
             {backward, 0},
             {forward, 1},
             {send_forward, 1},
             {recv_backward, 1},
             {backward, 1}},
            {{recv_forward, 0, 1},
             {forward, 0, 1},
             {recv_forward, 1, 1},
             {forward, 1, 1},
             {backward, 0, 1},
             {send_backward, 0, 1},
             {backward, 1, 1},
             {send_backward, 1, 1}}};
  expect_rejected(sc, "deadlock");
}

TEST(scheduler_validate, rejects_a_same_chip_chunk_out_of_order) {
  // Chip 1 holds chunks 1 and 2: chunk 2's forward must follow chunk 1's.
  auto sc = make_forward_schedule(pipeline_layout::dealt({1, 2}), 1);
  auto& list = sc.ops[1];
  ASSERT_EQ(list.size(), 3u);
  std::rotate(list.begin(), list.begin() + 2, list.end()); // F(c2) recv F(c1)
  expect_rejected(sc, "chip 1, op 0 (forward(c2, 0)), chunk 2, micro-batch "
                      "0: forward before chunk 1's forward on the same chip");
}

TEST(scheduler_validate, rejects_exceeding_the_bound) {
  // GPipe lists under the 1F1B label: chip 0 holds all 6 activations.
  auto sc = make_schedule(schedule_kind::gpipe, 4, 6);
  sc.kind = schedule_kind::one_f_one_b;
  expect_rejected(sc, "chip 0, op 8 (forward(4)), chunk 0, micro-batch 4: "
                      "holds 5 activations in flight, above the 1f1b bound "
                      "4");
}

TEST(scheduler_validate, rejects_one_warm_up_forward_too_many) {
  // 1F1B 3x4, last chip: rf0 F0 B0 sb0 rf1 F1 ...; forward(1) before
  // backward(0) makes it hold 2 > 1.
  auto sc = make_schedule(schedule_kind::one_f_one_b, 3, 4);
  auto& last = sc.ops[2];
  std::rotate(last.begin() + 2, last.begin() + 4, last.begin() + 6);
  ASSERT_EQ(last[3], (op{forward, 1, 2}));
  expect_rejected(sc, "chip 2, op 3 (forward(c2, 1)), chunk 2, micro-batch "
                      "1: holds 2 activations in flight, above the 1f1b "
                      "bound 1");
}

TEST(scheduler_validate, rejects_w_deferred_past_the_zb_h1_bound) {
  // ZB-H1 3x6: every W of chip 0 moved to the end keeps all 6
  // micro-batches' graphs alive, above min(p, m) = 3.
  auto sc = make_schedule(schedule_kind::zb_h1, 3, 6);
  auto& first = sc.ops[0];
  std::stable_partition(first.begin(), first.end(),
                        [](const op& x) { return x.kind != backward_weight; });
  expect_rejected(sc, "activations in flight, above the zb-h1 bound 3");
}

TEST(scheduler_validate, rejects_backward_in_forward_only) {
  auto sc = make_forward_schedule(1, 2);
  sc.ops[0].push_back({backward, 0});
  expect_rejected(sc, "chip 0, op 2 (backward(0)), chunk 0, micro-batch 0: "
                      "backward op in a forward-only schedule");
}

TEST(scheduler_validate, rejects_missing_forward_in_forward_only) {
  auto sc = make_forward_schedule(2, 3);
  erase_ops(sc, 1, [](const op& x) { return x.micro_batch == 1; });
  expect_rejected(sc, "chip 1, op 4 (end of list), chunk 1, micro-batch 1: "
                      "never forwarded");
}

TEST(scheduler_validate, rejects_a_training_schedule_without_backwards) {
  // A training step (forward_only false) that never backwards is broken
  // even though its lists equal a valid forward-only step.
  auto sc = make_forward_schedule(2, 2);
  sc.forward_only = false;
  expect_rejected(sc, "never backwarded");
}

TEST(scheduler_validate, rejects_bad_shape) {
  auto sc = make_schedule(schedule_kind::gpipe, 2, 2);
  sc.ops.pop_back();
  expect_rejected(sc, "ops has 1 chip lists for 2 chips");

  sc = make_schedule(schedule_kind::gpipe, 2, 2);
  sc.ops[0][0].micro_batch = 2;
  expect_rejected(sc, "chip 0, op 0 (forward(2)): micro-batch 2 outside "
                      "[0, 2)");

  sc = make_schedule(schedule_kind::gpipe, 2, 2);
  sc.ops[0][0].chunk = 7;
  expect_rejected(sc, "chip 0, op 0 (forward(c7, 0)): chunk 7 outside [0, 2)");

  sc = make_schedule(schedule_kind::gpipe, 2, 2);
  sc.micro_batches = 0;
  expect_rejected(sc, "micro_batches = 0");

  sc = make_schedule(schedule_kind::gpipe, 2, 2);
  sc.layout = pipeline_layout::dealt({2, 2});
  expect_rejected(sc, "gpipe runs one chunk per chip");
}

TEST(scheduler_validate, peak_in_flight_counts_held_activations) {
  auto sc = make_schedule(schedule_kind::gpipe, 3, 5);
  EXPECT_EQ(peak_in_flight(sc, 0), 5);
  sc = make_schedule(schedule_kind::one_f_one_b, 3, 5);
  EXPECT_EQ(peak_in_flight(sc, 0), 3);
  EXPECT_EQ(peak_in_flight(sc, 1), 2);
  EXPECT_EQ(peak_in_flight(sc, 2), 1);
  EXPECT_THROW(peak_in_flight(sc, 3), internal_error);
  EXPECT_THROW(peak_in_flight(sc, -1), internal_error);
  // A split backward holds a micro-batch until its W.
  sc = make_schedule(schedule_kind::zb_h1, 2, 2);
  EXPECT_EQ(peak_in_flight(sc, 1), 2);
}

} // namespace
} // namespace h2::scheduler
