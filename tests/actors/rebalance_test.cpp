// Live rebalancing in a running job (docs/rebalance.md), on the virtual
// clock: the policy reads what the chips charge, so these figures are
// deterministic. A chip throttled 2x mid-run is worked around within 20
// steps with the policy on, not with it off; steady speeds, with or without
// noise, never rebalance; a move's link time is charged on the virtual
// clock; noise is reproducible from its seed.
#include "h2/actors/local_job.hpp"
#include "h2/runtime/auto_plan.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "h2/scheduler/rebalance.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

namespace h2::test {
namespace {

/// The demo's four chips under a smaller GPT (10 layers): a step is about
/// 0.07 virtual seconds, a run of 200 steps a few seconds of CPU.
std::shared_ptr<job_config> cluster_job(int steps) {
  auto j = std::make_shared<job_config>(parse_job(R"(
[job]
seed = 7
[model]
vocab_size = 33
seq_len = 32
d_model = 64
n_head = 2
n_layer = 8
[data]
source = "markov"
entropy_rate = 1.0
[train]
steps = 200
global_batch = 16
micro_batch = 2
lr = 2e-3
[emulation]
clock = "virtual"
memory_scale = 2e-3
time_scale = 4000
overhead_scale = 0.01
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x",
         "emulated:a100-sxm-40gb", "emulated:a100-sxm-40gb"]
)",
                                                  "rebalance.toml"));
  j->train.steps = steps;
  return j;
}

const chip_id throttled_chip{0, 0}; // the only H100: its kind is its own

/// HeteroAuto's best plan within the live limits from `start` when chip
/// 0:0 runs `factor` times slower than profiled.
plan best_within(const job_config& job, const plan& start, double factor) {
  runtime::profiled_measurements profiled(job);
  scheduler::function_measurements slowed(
    [&](const chip_spec& c, layer_kind k, int size) {
      auto t = profiled.layer(c, k, size);
      if (c.id == throttled_chip) {
        t.forward_seconds *= factor;
        t.backward_seconds *= factor;
      }
      return t;
    },
    [&](const chip_spec& c, layer_kind k) {
      return profiled.optimizer(c, k) * (c.id == throttled_chip ? factor : 1);
    });
  auto best = scheduler::best_plan_within(job, slowed, start);
  EXPECT_TRUE(best.has_value());
  return best->value;
}

runtime::step_recorder run(const std::shared_ptr<const job_config>& job,
                           const plan& p, std::map<int, plan> replans = {}) {
  actors::local_job local(job, p);
  runtime::step_recorder recorder;
  actors::run_options o(job->train.steps);
  o.replans = std::move(replans);
  local.run(o, recorder);
  return recorder;
}

TEST(actors_rebalance, a_throttled_chip_is_worked_around_with_the_policy_on) {
  constexpr int throttle_step = 10, steps = 40;
  auto off = cluster_job(steps);
  off->drills = {drill{throttle_step, throttled_chip, 2}};
  const plan start = best_within(*off, scheduler::make_plan(*off), 1);
  auto on = std::make_shared<job_config>(*off);
  on->rebalance.policy = rebalance_mode::automatic;

  // The baseline: HeteroAuto's best plan for the throttled cluster, run
  // throttled from the start.
  auto throttled = cluster_job(5);
  throttled->drills = {drill{0, throttled_chip, 2}};
  const auto baseline =
    run(throttled, best_within(*throttled, start, 2)).steps.back().step_seconds;

  const auto with = run(on, start);
  const auto without = run(off, start);
  ASSERT_EQ(with.steps.size(), static_cast<std::size_t>(steps));
  EXPECT_EQ(with.steps[throttle_step - 1].step_seconds,
            without.steps[throttle_step - 1].step_seconds)
    << "the same before the throttle";
  EXPECT_GT(without.steps[throttle_step].step_seconds,
            1.2 * without.steps[throttle_step - 1].step_seconds)
    << "the drill slowed the job down";
  ASSERT_EQ(with.rebalances.size(), 1u);
  EXPECT_GT(with.rebalances[0].step, throttle_step);
  EXPECT_LE(with.rebalances[0].step, throttle_step + 20);
  EXPECT_EQ(with.rebalances[0].reason, "throttled chip 0:0");
  const double recovered = with.steps[throttle_step + 19].step_seconds;
  EXPECT_LE(recovered, 1.10 * baseline)
    << "policy on: " << recovered << " s/step against the baseline's "
    << baseline;
  const double stuck = without.steps.back().step_seconds;
  EXPECT_GT(stuck, 1.10 * baseline)
    << "policy off: " << stuck << " s/step against the baseline's " << baseline;
  EXPECT_TRUE(without.rebalances.empty());
}

TEST(actors_rebalance, steady_speeds_never_rebalance_in_200_steps) {
  auto job = cluster_job(200);
  job->rebalance.policy = rebalance_mode::automatic;
  const plan best = best_within(*job, scheduler::make_plan(*job), 1);
  EXPECT_TRUE(run(job, best).rebalances.empty());

  auto noisy = std::make_shared<job_config>(*job);
  noisy->emulation.noise = 0.1;
  noisy->emulation.noise_seed = 3;
  EXPECT_TRUE(run(noisy, best).rebalances.empty()) << "noise = 0.1";

  // From the even plan: one rebalance as soon as the window allows (after
  // `window` observed steps), then never again (no oscillation).
  const auto from_even = run(job, scheduler::make_plan(*job));
  ASSERT_EQ(from_even.rebalances.size(), 1u);
  EXPECT_EQ(from_even.rebalances[0].step, job->rebalance.window);
  EXPECT_EQ(from_even.rebalances[0].reason, "live metrics");
  EXPECT_EQ(from_even.rebalances[0].generation, 1);
}

TEST(actors_rebalance, a_moves_link_time_is_charged_on_the_virtual_clock) {
  auto job = cluster_job(4);
  const plan start = scheduler::make_plan(*job);
  const plan moved = best_within(*job, start, 1);
  ASSERT_NE(to_json(moved, -1), to_json(start, -1));
  const auto r = run(job, start, {{2, moved}});
  ASSERT_EQ(r.rebalances.size(), 1u);
  const auto& e = r.rebalances[0];
  EXPECT_EQ(e.step, 2);
  EXPECT_EQ(e.reason, "--replan");
  double bytes = 0, seconds = 0;
  for (const auto& m : scheduler::layer_moves(*job, start, moved)) {
    bytes += m.bytes;
    seconds += m.seconds;
  }
  EXPECT_GT(seconds, 0);
  EXPECT_DOUBLE_EQ(e.moved_bytes, bytes);
  EXPECT_DOUBLE_EQ(e.charged_seconds, seconds);
  // The step after the move starts that much later than the one before
  // ended.
  const auto& before = r.steps[1];
  const auto& after = r.steps[2];
  EXPECT_NEAR(after.virtual_end - after.virtual_step_seconds -
                before.virtual_end,
              seconds, 1e-9);
}

TEST(actors_rebalance, noise_is_reproducible_from_its_seed) {
  auto quiet = cluster_job(3);
  const plan p = scheduler::make_plan(*quiet);
  auto times = [&](double noise, std::uint64_t seed) {
    auto job = std::make_shared<job_config>(*quiet);
    job->emulation.noise = noise;
    job->emulation.noise_seed = seed;
    std::vector<double> out;
    for (const auto& s : run(job, p).steps)
      out.push_back(s.virtual_step_seconds);
    return out;
  };
  const auto a = times(0.1, 1);
  EXPECT_EQ(a, times(0.1, 1));
  EXPECT_NE(a, times(0.1, 2));
  const auto none = times(0, 1);
  EXPECT_NE(a, none);
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], none[i], 0.1 * none[i]) << "step " << i;
}

} // namespace
} // namespace h2::test
