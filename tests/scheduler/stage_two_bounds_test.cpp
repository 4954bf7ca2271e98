// Stage 2's lower bounds, called directly (scheduler/stage_two_impl.hpp,
// docs/planner.md "Stage 2"): exact values on cases small enough to compute
// by hand, and never above the simulated step of any plan they cover on
// small random instances, searched exhaustively. Branch and bound and the
// joint search of several groups are only exact while this holds.
#include "planner_fixtures.hpp"
#include "scheduler/stage_two_impl.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>

namespace h2::test {
namespace {

using namespace scheduler::stage_two_detail;
using scheduler::pipeline_candidate;
using scheduler::planner;
using scheduler::replica_group;

stage_value stage(double forward, double backward, double optimizer,
                  double allreduce) {
  stage_value v;
  v.ok = true;
  v.forward = forward;
  v.backward = backward;
  v.optimizer = optimizer;
  v.allreduce = allreduce;
  return v;
}

// Two stages: a middle one (at least one block) with h(k) = 2k, and the
// last (at least none) with h(k) = 0.5 + k.
relaxation two_stages(double last_slope) {
  relaxation r;
  const double inverse_last = last_slope > 0 ? 1 / last_slope : 0;
  r.sum_inverse_slope = {0.5 + inverse_last, inverse_last, 0};
  r.sum_intercept_over_slope = {0.5 * inverse_last, 0.5 * inverse_last, 0};
  r.max_floor = {2, 0.5, -inf};
  r.flat_stages = {last_slope > 0 ? 0.0 : 1.0, last_slope > 0 ? 0.0 : 1.0, 0};
  return r;
}

TEST(scheduler_stage_two_bounds, relaxation_by_hand) {
  // 4 blocks over both: 2k = 0.5 + (4 - k) at k = 1.5, so 3.
  EXPECT_DOUBLE_EQ(relaxed_bound(two_stages(1), 0, 4), 3.0);
  // 1 block: the middle stage's floor (2 x 1) beats 1.5 / 1.5 = 1.
  EXPECT_DOUBLE_EQ(relaxed_bound(two_stages(1), 0, 1), 2.0);
  // The last stage alone with 3 blocks: 0.5 + 3.
  EXPECT_DOUBLE_EQ(relaxed_bound(two_stages(1), 1, 3), 3.5);
  // A stage whose blocks cost nothing takes them all: only the floors hold.
  EXPECT_DOUBLE_EQ(relaxed_bound(two_stages(0), 0, 4), 2.0);
}

// Three stages, 7 pipeline layers (embedding, 5 blocks, head), 3
// micro-batches. Per block F/B: stage 0 1/2, stage 1 2/3, stage 2 1/1; the
// head 0.5/0.5. Fastest links into stages 1, 2: 0.25, 0.5 forward; into
// stages 0, 1: 0.125, 0.25 backward. The head-only last stage updates in
// 0.25. So:
// - the round trip's links: 0.25 + 0.5 + 0.125 + 0.25 = 1.125; the path to
//   stage 1 and back: 0.25 + 0.125 = 0.375;
// - a block's F + B: 3, 5, 2 (cheapest from stage 1 on: 2); the head's 1;
// - with m - 1 = 2 and w_s = min(2 - s, 2): 1F1B's h_s(k) = (2 - w_s) F k +
//   2 B k (+ 2 (0.5 + 0.5) on the last): stage 1 8k, stage 2 2 + 4k.
bound_inputs three_stages(schedule_kind schedule) {
  bound_inputs in;
  in.schedule = schedule;
  in.micro_batches = 3;
  in.layers = 7;
  in.block = {{1, 2}, {2, 3}, {1, 1}};
  in.head = {0.5, 0.5};
  in.min_activation_link_seconds = {0, 0.25, 0.5};
  in.min_gradient_link_seconds = {0.125, 0.25, 0};
  in.last_stage_min_optimizer_seconds = 0.25;
  return in;
}

// Stage 0 = layers [0, 2) with F 1.5, B 2.5, update 1, all-reduce 0.5;
// stage 1 = [2, 4) with F 4, B 6, update 0.5, all-reduce 2 (stage 0's
// all-reduce is the one that counts: stage 0 ends last); stage 2 = [4, 7)
// with F 2.5, B 2.5, update 0.75.
const stage_value stage0 = stage(1.5, 2.5, 1, 0.5);
const stage_value stage1 = stage(4, 6, 0.5, 2);
const stage_value stage2 = stage(2.5, 2.5, 0.75, 0);

TEST(scheduler_stage_two_bounds, one_f_one_b_paths_by_hand) {
  path_bounds b(three_stages(schedule_kind::one_f_one_b));
  // After stage 0: the fill path 3 x 4 = 12; compute 4 + (head 1 + one
  // block on stage 1, 5 + the 3 other blocks at 2) = 16, + links 1.125;
  // steady state max(stage 0: 0 x 1.5 + 2 x 2.5 = 5, the relaxation of 4
  // blocks over stages 1, 2: 8k = 2 + 4(4 - k) at k = 1.5, 12); + stage 0's
  // all-reduce 0.5 + the slowest update 1.
  b.push(0, stage0);
  EXPECT_DOUBLE_EQ(b.lower_bound(0, 2), (4 + 12 + 1.125) + 12 + (0.5 + 1));
  // After stage 1: the fill path 4 + 0.375 + 3 x 10 = 34.375; compute 14 +
  // head 1 + 2 blocks at 2 = 19, + 1.125; steady state max(stage 1: 1 x 4 +
  // 2 x 6 = 16, the last stage with 2 blocks: 10).
  b.push(1, stage1);
  EXPECT_DOUBLE_EQ(b.lower_bound(1, 4), (19 + 1.125) + 16 + (0.5 + 1));
  // Complete: compute 19 + 1.125, steady state max(16, last: 2 x 2.5 + 2 x
  // 2.5 = 10), the update still 1.
  b.push(2, stage2);
  EXPECT_DOUBLE_EQ(b.lower_bound(2, 7), (19 + 1.125) + 16 + (0.5 + 1));
}

TEST(scheduler_stage_two_bounds, gpipe_paths_by_hand) {
  path_bounds b(three_stages(schedule_kind::gpipe));
  // After stage 0: compute 4 + 12 + links 1.125, then (m - 1) x (the
  // largest F + the largest B): F max(1.5, 2k = 0.5 + (4 - k) at k = 1.5:
  // 3), B max(2.5, 3k = 0.5 + (4 - k) at k = 1.125: 3.375).
  b.push(0, stage0);
  EXPECT_DOUBLE_EQ(b.lower_bound(0, 2), 17.125 + 2 * (3 + 3.375) + 1.5);
  // After stage 1: compute 19 + 1.125; F max(4, 0.5 + 2 = 2.5), B max(6,
  // 2.5).
  b.push(1, stage1);
  EXPECT_DOUBLE_EQ(b.lower_bound(1, 4), 20.125 + 2 * (4 + 6) + 1.5);
  b.push(2, stage2);
  EXPECT_DOUBLE_EQ(b.lower_bound(2, 7), 20.125 + 2 * (4 + 6) + 1.5);
  // The update of the head-only last stage counts when it is the slowest.
  auto in = three_stages(schedule_kind::gpipe);
  in.last_stage_min_optimizer_seconds = 3;
  path_bounds slow_update(in);
  slow_update.push(0, stage0);
  EXPECT_DOUBLE_EQ(slow_update.lower_bound(0, 2),
                   17.125 + 2 * (3 + 3.375) + 0.5 + 3);
}

TEST(scheduler_stage_two_bounds, joint_option_by_hand) {
  group_solution option;
  option.phase = 10;
  option.optimizer = 2;
  option.first_gradient_bytes = 12;
  // 3 replicas: 2 x 2 crossings of the edge into the chip, each latency 0.5
  // + 12 bytes x 0.5 on the wire / 3 x 0.25 s per byte = 1 s.
  const double b = joint_option_bound(schedule_kind::one_f_one_b, {0.5, 0.25}, 3, 0.5,
                                     option);
  EXPECT_DOUBLE_EQ(b, 16 * (1 - 1e-12));
  EXPECT_LT(b, 16.0);
  // One replica in all: no all-reduce.
  EXPECT_DOUBLE_EQ(joint_option_bound(schedule_kind::one_f_one_b, {0.5, 0.25}, 1, 0.5,
                                      option),
                   12 * (1 - 1e-12));
}

struct small_instance {
  std::uint64_t seed;
  int chips, kinds, layers, global_batch;
  schedule_kind schedule;
  double tightness;
};

/// Every assignment of one group at every micro-batch size, simulated as a
/// whole plan; every prefix of every assignment holds the path bounds to
/// the best completion of that prefix.
TEST(scheduler_stage_two_bounds, paths_never_exceed_the_optimum) {
  std::size_t prefixes = 0, candidates = 0, replicated = 0;
  double tightest = 0; // the largest bound / optimum seen
  for (const auto& spec : std::vector<small_instance>{
         {61, 4, 2, 8, 4, schedule_kind::one_f_one_b, 1.6},
         {62, 4, 3, 7, 4, schedule_kind::gpipe, 1.6},
         {63, 3, 2, 9, 4, schedule_kind::one_f_one_b, 2.5},
         {81, 4, 1, 8, 4, schedule_kind::one_f_one_b, 12},
         {82, 6, 2, 9, 6, schedule_kind::gpipe, 15},
         {84, 6, 1, 10, 6, schedule_kind::gpipe, 3},
         {85, 4, 2, 8, 4, schedule_kind::zb_h1, 1.6},
         {86, 6, 2, 9, 6, schedule_kind::zb_h1, 15}}) {
    auto in = random_instance(spec.seed, spec.chips, spec.kinds, spec.layers,
                              spec.global_batch, spec.schedule, spec.tightness);
    scheduler::planner_options options;
    options.exhaustive_chips = 0; // structured: groups of identical replicas
    planner::impl impl(*in.job, *in.measurements, options);
    for (const auto& c : impl.stage_one()) {
      if (c.groups.size() != 1)
        continue;
      SCOPED_TRACE("seed " + std::to_string(spec.seed) + ", " + c.description);
      const auto& g = c.groups.front();
      const int replicas = static_cast<int>(g.replicas.size());
      if (spec.global_batch % replicas != 0)
        continue;
      const int sequences = spec.global_batch / replicas;
      ++candidates;
      replicated += replicas > 1 ? 1 : 0;
      group_search search(impl, g, true, static_cast<int>(g.replicas.size()));
      for (int micro_batch_size : impl.micro_batch_sizes(sequences)) {
        search.setup(micro_batch_size, sequences);
        std::vector<std::vector<int>> assignments;
        search.enumerate(
          [&](const std::vector<int>& ends) { assignments.push_back(ends); });
        // The best simulated step of every prefix's completions.
        std::map<std::vector<int>, double> best;
        for (const auto& ends : assignments) {
          group_solution sol;
          sol.micro_batch_size = micro_batch_size;
          sol.ends = ends;
          plan p;
          p.schedule = impl.pipeline_schedule;
          add_replicas(impl, g, search, sol, sequences, p);
          auto sim = impl.simulate_plan(p, false);
          if (!sim.fits)
            continue;
          for (std::size_t s = 0; s < ends.size(); ++s) {
            std::vector<int> prefix(ends.begin(),
                                    ends.begin() + static_cast<long>(s) + 1);
            auto [it, fresh] = best.emplace(prefix, sim.step_seconds);
            if (!fresh)
              it->second = std::min(it->second, sim.step_seconds);
          }
        }
        search.setup(micro_batch_size, sequences);
        for (const auto& [prefix, optimum] : best) {
          path_bounds bounds = search.bounds();
          int first = 0;
          for (std::size_t s = 0; s < prefix.size(); ++s) {
            bounds.push(static_cast<int>(s),
                        search.eval(static_cast<int>(s), first, prefix[s]));
            first = prefix[s];
          }
          const int s = static_cast<int>(prefix.size()) - 1;
          const double bound = bounds.lower_bound(s, prefix.back());
          // A bound that is exact sums in another order than the
          // simulator, so it may exceed the optimum by rounding (1e-16
          // relative); the planner is exact to 1e-9 (optimality_test.cpp).
          EXPECT_LE(bound, optimum * (1 + 1e-12))
            << "relative excess " << (bound - optimum) / optimum
            << ", micro-batches of " << micro_batch_size << ", stages 0.." << s
            << " ending at " << prefix.back();
          tightest = std::max(tightest, bound / optimum);
          ++prefixes;
        }
      }
    }
  }
  EXPECT_GT(candidates, 10u);
  EXPECT_GT(replicated, 0u) << "some candidate should all-reduce";
  // Bounds that held only by being tiny would prune nothing.
  EXPECT_GT(tightest, 0.9);
  std::printf("[ info ] %zu candidates (%zu with replicas), %zu prefixes, "
              "tightest bound %.4f of the optimum\n",
              candidates, replicated, prefixes, tightest);
}

/// Several groups: every split of the batch and every combination of the
/// groups' options, simulated as a whole plan, costs at least each option's
/// joint_option_bound().
TEST(scheduler_stage_two_bounds, joint_options_never_exceed_the_step) {
  std::size_t combinations = 0, candidates = 0;
  double tightest = 0;
  for (const auto& spec : std::vector<small_instance>{
         {71, 4, 2, 6, 4, schedule_kind::one_f_one_b, 12},
         {72, 3, 3, 5, 4, schedule_kind::gpipe, 12},
         {73, 4, 3, 6, 3, schedule_kind::one_f_one_b, 20},
         {74, 4, 2, 6, 4, schedule_kind::zb_h1, 12}}) {
    auto in = random_instance(spec.seed, spec.chips, spec.kinds, spec.layers,
                              spec.global_batch, spec.schedule, spec.tightness);
    planner::impl impl(*in.job, *in.measurements, {});
    const double wire_ratio =
      in.job->transport.reduce_dtype == dtype::fp32 ? 1.0 : 0.5;
    for (const auto& c : impl.stage_one()) {
      if (c.groups.size() != 2)
        continue;
      SCOPED_TRACE("seed " + std::to_string(spec.seed) + ", " + c.description);
      ++candidates;
      const auto inbound = inbound_links(impl, c);
      ASSERT_EQ(inbound.size(), 2u);
      std::vector<std::unique_ptr<group_search>> searches;
      std::vector<int> unit;
      int replicas = 0;
      for (const auto& g : c.groups)
        replicas += static_cast<int>(g.replicas.size());
      for (const auto& g : c.groups) {
        searches.push_back(
          std::make_unique<group_search>(impl, g, false, replicas));
        unit.push_back(static_cast<int>(g.replicas.size()));
      }
      // Every option of group i at `sequences` per replica.
      auto options_of = [&](std::size_t i, int sequences) {
        std::vector<group_solution> out;
        for (int micro_batch_size : impl.micro_batch_sizes(sequences)) {
          searches[i]->setup(micro_batch_size, sequences);
          searches[i]->enumerate([&](const std::vector<int>& ends) {
            auto sol = searches[i]->evaluate(ends);
            if (std::isfinite(sol.step))
              out.push_back(sol);
          });
        }
        return out;
      };
      for (int first = unit[0]; first < spec.global_batch; first += unit[0]) {
        const int second = spec.global_batch - first;
        if (second % unit[1] != 0)
          continue;
        const std::vector<int> split = {first, second};
        const auto options0 = options_of(0, first / unit[0]);
        const auto options1 = options_of(1, second / unit[1]);
        for (const auto& a : options0)
          for (const auto& b : options1) {
            plan p;
            p.schedule = impl.pipeline_schedule;
            add_replicas(impl, c.groups[0], *searches[0], a, split[0] / unit[0],
                         p);
            add_replicas(impl, c.groups[1], *searches[1], b, split[1] / unit[1],
                         p);
            auto sim = impl.simulate_plan(p, false);
            if (!sim.fits)
              continue;
            const double bound = std::max(
              joint_option_bound(spec.schedule, inbound[0], c.replicas(),
                                 wire_ratio, a),
              joint_option_bound(spec.schedule, inbound[1], c.replicas(),
                                 wire_ratio, b));
            EXPECT_LE(bound, sim.step_seconds) << to_json(p);
            tightest = std::max(tightest, bound / sim.step_seconds);
            ++combinations;
          }
      }
    }
  }
  EXPECT_GT(candidates, 0u);
  EXPECT_GT(combinations, 100u);
  EXPECT_GT(tightest, 0.5);
  std::printf("[ info ] %zu two-group candidates, %zu plans, tightest bound "
              "%.4f of the step\n",
              candidates, combinations, tightest);
}

} // namespace
} // namespace h2::test
