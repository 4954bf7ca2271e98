// HeteroAuto's exactness (issue 4, "Optimality"): on small instances stage 2
// equals brute force for every stage-1 candidate, and the whole planner
// equals exhaustive search over every plan, with respect to the simulated
// step time.
#include "planner_fixtures.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <set>

namespace h2::test {
namespace {

using scheduler::pipeline_candidate;
using scheduler::planner;
using scheduler::replica_group;

struct instance_spec {
  std::uint64_t seed;
  int chips;
  int kinds;
  int layers;
  int global_batch;
  schedule_kind schedule;
  double tightness = 0; ///< 0: random (planner_fixtures.hpp)
};

std::string name_of(const instance_spec& s) {
  return "seed " + std::to_string(s.seed) + ", " + std::to_string(s.chips) +
         " chips of " + std::to_string(s.kinds) + " kinds, " +
         std::to_string(s.layers) + " layers, batch " +
         std::to_string(s.global_batch) + ", " +
         std::string(to_string(s.schedule));
}

// Up to 6 chips and 16 layers, every schedule plans run, memory binding in
// some.
const std::vector<instance_spec> stage_two_instances = {
  {11, 6, 3, 16, 2, schedule_kind::one_f_one_b, 1.8},
  {12, 6, 2, 16, 2, schedule_kind::gpipe, 1.7},
  {13, 6, 3, 12, 4, schedule_kind::one_f_one_b},
  {14, 5, 2, 10, 4, schedule_kind::gpipe, 2.5},
  {15, 6, 2, 8, 4, schedule_kind::one_f_one_b, 1.8},
  {16, 4, 2, 16, 4, schedule_kind::one_f_one_b},
  {17, 6, 3, 14, 4, schedule_kind::gpipe, 3.0},
  {18, 6, 3, 12, 4, schedule_kind::zb_h1, 1.8},
  {19, 5, 2, 10, 4, schedule_kind::zb_h1},
};

TEST(scheduler_optimality, stage_two_equals_brute_force_for_every_candidate) {
  auto t0 = std::chrono::steady_clock::now();
  std::size_t candidates = 0, evaluated = 0, feasible = 0, recomputing = 0;
  for (const auto& spec : stage_two_instances) {
    SCOPED_TRACE(name_of(spec));
    auto in = random_instance(spec.seed, spec.chips, spec.kinds, spec.layers,
                              spec.global_batch, spec.schedule, spec.tightness);
    scheduler::planner_options opt;
    opt.exhaustive_chips = 0; // the structured stage 1 of larger clusters
    planner pl(*in.job, *in.measurements, opt);
    auto cands = pl.stage_one();
    ASSERT_FALSE(cands.empty());
    for (const auto& c : cands) {
      SCOPED_TRACE(c.description);
      auto r = pl.stage_two(c);
      EXPECT_TRUE(r.proven_optimal);
      double brute = brute_force(pl, c, *in.job, false, &evaluated);
      EXPECT_EQ(r.feasible, std::isfinite(brute));
      EXPECT_LE(relative(r.step_seconds, brute), 1e-9)
        << "stage 2 " << r.step_seconds << " s, brute force " << brute << " s";
      if (r.feasible) {
        ++feasible;
        for (const auto& rep : r.value.replicas)
          for (const auto& st : rep.stages)
            recomputing += st.recompute.any() ? 1 : 0;
        // What stage 2 returns is a plan of the job with that step time.
        validate_plan(r.value, *in.job, "plan");
        auto sim = pl.simulate(r.value);
        EXPECT_TRUE(sim.fits);
        EXPECT_EQ(sim.step_seconds, r.step_seconds);
      }
      ++candidates;
    }
  }
  EXPECT_GT(feasible, candidates / 2);
  EXPECT_GT(recomputing, 0u) << "memory should bind in some instances";
  std::printf(
    "[ info ] %zu candidates (%zu feasible, %zu recomputing "
    "stages), %zu brute-force plans, %.2f s\n",
    candidates, feasible, recomputing, evaluated,
    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count());
}

// Recomputation where a stage does not fit otherwise is optimal: the
// brute force over every subset of recomputing stages finds nothing better.
TEST(scheduler_optimality, minimal_recomputation_equals_every_subset) {
  int recomputing = 0;
  for (const auto& spec : std::vector<instance_spec>{
         {21, 3, 2, 8, 4, schedule_kind::one_f_one_b},
         {22, 3, 3, 7, 8, schedule_kind::gpipe},
         {23, 4, 2, 6, 4, schedule_kind::one_f_one_b}}) {
    SCOPED_TRACE(name_of(spec));
    auto in = random_instance(spec.seed, spec.chips, spec.kinds, spec.layers,
                              spec.global_batch, spec.schedule, 1.7);
    scheduler::planner_options whole_stages; // the subsets below are of these
    whole_stages.recompute = scheduler::recompute_levels::full;
    planner pl(*in.job, *in.measurements, whole_stages);
    for (const auto& c : pl.stage_one()) {
      if (c.replicas() != 1)
        continue;
      SCOPED_TRACE(c.description);
      double minimal = brute_force(pl, c, *in.job, false);
      double all = brute_force(pl, c, *in.job, true);
      EXPECT_LE(relative(minimal, all), 1e-12);
      auto r = pl.stage_two(c);
      EXPECT_LE(relative(r.step_seconds, all), 1e-9);
      if (r.feasible)
        for (const auto& s : r.value.replicas.front().stages)
          recomputing += s.recompute.any() ? 1 : 0;
    }
  }
  EXPECT_GT(recomputing, 0) << "memory should bind somewhere";
}

/// Every set of disjoint ordered chip lists over subsets of `n` chips.
std::vector<std::vector<std::vector<int>>> all_layouts(int n) {
  std::vector<std::vector<std::vector<int>>> out;
  std::vector<std::vector<int>> reps;
  std::function<void(int)> place = [&](int chip) {
    if (chip == n) {
      if (!reps.empty())
        out.push_back(reps);
      return;
    }
    place(chip + 1); // unused
    for (std::size_t r = 0; r < reps.size(); ++r)
      for (std::size_t at = 0; at <= reps[r].size(); ++at) {
        reps[r].insert(reps[r].begin() + static_cast<long>(at), chip);
        place(chip + 1);
        reps[r].erase(reps[r].begin() + static_cast<long>(at));
      }
    reps.push_back({chip}); // a new replica (sets: replicas unordered)
    place(chip + 1);
    reps.pop_back();
  };
  place(0);
  return out;
}

TEST(scheduler_optimality, planner_equals_exhaustive_search) {
  auto t0 = std::chrono::steady_clock::now();
  std::size_t plans = 0;
  int infeasible = 0;
  for (const auto& spec : std::vector<instance_spec>{
         {31, 4, 3, 8, 4, schedule_kind::one_f_one_b},
         {32, 4, 2, 8, 4, schedule_kind::gpipe},
         {33, 3, 3, 6, 4, schedule_kind::one_f_one_b},
         {34, 4, 2, 5, 2, schedule_kind::one_f_one_b},
         {35, 2, 2, 8, 4, schedule_kind::gpipe},
         {36, 4, 4, 6, 3, schedule_kind::one_f_one_b}}) {
    SCOPED_TRACE(name_of(spec));
    for (double tightness : {3.0, 1.7, 1.25}) {
      auto in = random_instance(spec.seed, spec.chips, spec.kinds, spec.layers,
                                spec.global_batch, spec.schedule, tightness);
      // Single replicas are searched over every subset of whole-stage
      // recomputation below.
      scheduler::planner_options whole_stages;
      whole_stages.recompute = scheduler::recompute_levels::full;
      planner pl(*in.job, *in.measurements, whole_stages);
      // Exhaustive: every layout, every replica on its own (its own
      // partition, micro-batch size and share of the batch).
      double exhaustive = std::numeric_limits<double>::infinity();
      for (const auto& layout :
           all_layouts(static_cast<int>(pl.chips().size()))) {
        if (static_cast<int>(layout.size()) > spec.global_batch)
          continue;
        bool deep = false;
        for (const auto& r : layout)
          deep = deep || static_cast<int>(r.size()) > spec.layers;
        if (deep)
          continue;
        pipeline_candidate c;
        for (const auto& r : layout)
          c.groups.push_back(replica_group{{r}});
        exhaustive = std::min(
          exhaustive, brute_force(pl, c, *in.job, layout.size() == 1, &plans));
      }
      try {
        auto result = pl.run();
        EXPECT_LE(relative(result.report.step_seconds, exhaustive), 1e-9)
          << "planner " << result.report.step_seconds << " s, exhaustive "
          << exhaustive << " s";
        EXPECT_TRUE(result.report.proven_optimal);
      } catch (const scheduler::infeasible_error& e) {
        ++infeasible;
        EXPECT_TRUE(std::isinf(exhaustive))
          << "planner found nothing, exhaustive " << exhaustive << ": "
          << e.what();
      }
    }
  }
  std::printf(
    "[ info ] exhaustive search simulated %zu plans (%d instances "
    "infeasible), %.2f s\n",
    plans, infeasible,
    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count());
}

} // namespace
} // namespace h2::test
