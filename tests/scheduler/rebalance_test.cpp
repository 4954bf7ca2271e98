// The live-rebalancing policy (docs/rebalance.md) without actors: a job's
// chips emulated by the tests' own measurements x a per-chip slowdown, with
// relative noise per op; the policy fed their observations step by step.
// Steady speeds (with and without noise) never rebalance; a 2x throttle is
// answered within 20 steps by a plan within 10% of the best one under the
// same limits (brute force), once; memory, the move's cost, the policy
// switch and the arithmetic of moves and calibration hold.
#include "planner_fixtures.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/cost_model.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "h2/scheduler/rebalance.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <optional>
#include <random>

namespace h2::test {
namespace {

using scheduler::best_plan_within;
using scheduler::chip_observation;
using scheduler::layer_timing;
using scheduler::live_calibration;
using scheduler::planner;
using scheduler::planner_options;
using scheduler::rebalance_config;
using scheduler::rebalance_mode;
using scheduler::rebalance_policy;
using scheduler::rebalance_proposal;
using scheduler::step_observations;

const chip_id c00{0, 0}, c01{0, 1}, c10{1, 0}, c11{1, 1};

/// The profiled measurements x a per-chip slowdown: how fast the chips of
/// an emulated run really are. Answers under the job's own profiles (the
/// chips' specs are looked up by id), so it also serves truth_job().
class true_measurements final : public scheduler::chip_measurements {
public:
  true_measurements(const job_config& job,
                    scheduler::chip_measurements& profiled,
                    std::map<chip_id, double> slowdown)
      : job_(&job), profiled_(&profiled), slowdown_(std::move(slowdown)) {}

  layer_timing layer(const chip_spec& chip, layer_kind kind,
                     int micro_batch_size) override {
    auto t = profiled_->layer(spec(chip), kind, micro_batch_size);
    t.forward_seconds *= factor(chip.id);
    t.backward_seconds *= factor(chip.id);
    return t;
  }
  double optimizer(const chip_spec& chip, layer_kind kind) override {
    return profiled_->optimizer(spec(chip), kind) * factor(chip.id);
  }

private:
  const chip_spec& spec(const chip_spec& chip) const {
    return *job_->find_chip(chip.id);
  }
  double factor(const chip_id& c) const {
    auto it = slowdown_.find(c);
    return it == slowdown_.end() ? 1.0 : it->second;
  }
  const job_config* job_;
  scheduler::chip_measurements* profiled_;
  std::map<chip_id, double> slowdown_;
};

/// `job` with a profile name of their own for the slowed chips (the
/// planner memoises measurements per profile).
job_config truth_job(const job_config& job,
                     const std::map<chip_id, double>& slowdown) {
  job_config out = job;
  for (auto& n : out.nodes)
    for (auto& c : n.chips)
      if (auto it = slowdown.find(c.id);
          it != slowdown.end() && it->second != 1) {
        c.profile.name += '#';
        c.profile.name += c.id.to_string();
      }
  return out;
}

/// A running job as the policy sees it: every op of chip c takes its
/// profiled time x slowdown(c) x (1 + noise x a standard normal draw).
class emulated_run {
public:
  emulated_run(const job_config& job, scheduler::chip_measurements& profiled,
               double noise = 0, std::uint64_t seed = 1)
      : job_(&job),
        profiled_(&profiled),
        costs_(job, profiled),
        noise_(noise),
        rng_(seed) {}

  void throttle(const chip_id& c, double factor) { slowdown_[c] = factor; }
  /// The chip's runtime needs `factor` x the memory model's peak.
  void memory_factor(const chip_id& c, double factor) { memory_[c] = factor; }
  const std::map<chip_id, double>& slowdown() const { return slowdown_; }

  step_observations step(const plan& p, int step) {
    step_observations out;
    out.step = step;
    const auto& cfg = job_->model;
    for (const auto& rep : p.replicas) {
      const int stages = static_cast<int>(rep.stages.size());
      for (int s = 0; s < stages; ++s) {
        const auto& st = rep.stages[static_cast<std::size_t>(s)];
        const chip_spec& chip = *job_->find_chip(st.chip);
        const double slow = value(slowdown_, st.chip);
        chip_observation o;
        o.chip = st.chip;
        for (int l = st.first_layer; l < st.end_layer; ++l) {
          auto t =
            profiled_->layer(chip, kind_of_layer(cfg, l), rep.micro_batch_size);
          layer_timing mean;
          for (int mb = 0; mb < rep.micro_batches; ++mb) {
            mean.forward_seconds += t.forward_seconds * slow * jitter();
            mean.backward_seconds +=
              (t.backward_seconds +
               (st.recompute.full ? t.forward_seconds : 0)) *
              slow * jitter();
          }
          mean.forward_seconds /= rep.micro_batches;
          mean.backward_seconds /= rep.micro_batches;
          o.layers.push_back(mean);
          o.optimizer_seconds +=
            profiled_->optimizer(chip, kind_of_layer(cfg, l)) * slow * jitter();
        }
        o.peak_bytes = costs_
                         .stage(chip, st.first_layer, st.end_layer,
                                rep.micro_batch_size, st.recompute)
                         .peak_bytes(scheduler::in_flight_bound(
                           p.schedule, stages, s, rep.micro_batches)) *
                       value(memory_, st.chip);
        out.chips.push_back(std::move(o));
      }
    }
    return out;
  }

private:
  static double value(const std::map<chip_id, double>& m, const chip_id& c) {
    auto it = m.find(c);
    return it == m.end() ? 1.0 : it->second;
  }
  double jitter() {
    if (noise_ == 0)
      return 1;
    return std::max(0.05, 1 + noise_ * normal_(rng_));
  }

  const job_config* job_;
  scheduler::chip_measurements* profiled_;
  scheduler::cost_model costs_;
  double noise_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> normal_{0.0, 1.0};
  std::map<chip_id, double> slowdown_, memory_;
};

/// Two kinds on two nodes, one pipeline a, a, b, b; 12 layers; 8 sequences.
job_config two_kinds_job(double memory_scale = 1.0,
                         const std::string& extra = "") {
  std::vector<kind_spec> kinds{{"a", "V", 1, 64, 200, 5e-6},
                               {"b", "V", 2, 64, 200, 5e-6}};
  return parse_job(job_toml(kinds, {{"a", "a"}, {"b", "b"}}, 10, 32,
                            schedule_kind::one_f_one_b, memory_scale, extra),
                   "rebalance");
}

/// HeteroAuto's plan of `job` as one pipeline (the run's starting plan).
plan pipeline_plan(const job_config& job, scheduler::chip_measurements& m) {
  planner_options o;
  o.max_replicas = 1;
  return scheduler::plan_auto(job, m, o).value;
}

rebalance_config on() {
  rebalance_config c;
  c.policy = rebalance_mode::automatic;
  return c;
}

/// The stage of `chip` in `p` (replica, stage index), which must exist.
const stage_plan& stage_of(const plan& p, const chip_id& chip) {
  for (const auto& r : p.replicas)
    for (const auto& s : r.stages)
      if (s.chip == chip)
        return s;
  ADD_FAILURE() << "no stage on chip " << chip.to_string();
  static const stage_plan none;
  return none;
}

/// The true step time of `p` and the true best within its limits (brute
/// force over every partition, micro-batch size and split of the batch
/// between the replicas, each replica its own group).
struct truth {
  double step_seconds = 0;
  double best_seconds = 0;
  bool fits = false;
};

truth truth_of(const job_config& job, scheduler::chip_measurements& profiled,
               const std::map<chip_id, double>& slowdown, const plan& p,
               const plan& limits) {
  job_config tj = truth_job(job, slowdown);
  true_measurements tm(job, profiled, slowdown);
  planner_options o;
  o.chips = plan_chips(limits);
  o.schedule = limits.schedule;
  planner pl(tj, tm, o);
  std::map<chip_id, int> index;
  for (std::size_t i = 0; i < pl.chips().size(); ++i)
    index[pl.chips()[i]->id] = static_cast<int>(i);
  scheduler::pipeline_candidate c;
  for (const auto& r : limits.replicas) {
    scheduler::replica_group g;
    g.replicas.emplace_back();
    for (const auto& s : r.stages)
      g.replicas.back().push_back(index.at(s.chip));
    c.groups.push_back(g);
  }
  truth out;
  auto sim = pl.simulate(p);
  out.step_seconds = sim.step_seconds;
  out.fits = sim.fits;
  out.best_seconds = brute_force(pl, c, tj, false);
  return out;
}

/// Runs `steps` steps from `first` under the policy, adopting every
/// proposal at once; returns the proposals.
std::vector<rebalance_proposal> run(rebalance_policy& policy, emulated_run& em,
                                    int first, int steps) {
  std::vector<rebalance_proposal> out;
  for (int step = first; step < first + steps; ++step) {
    if (auto p = policy.observe(em.step(policy.current(), step))) {
      policy.adopt(p->value, step + 1);
      out.push_back(std::move(*p));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Stability

TEST(scheduler_rebalance, steady_speeds_never_rebalance) {
  auto job = two_kinds_job();
  synthetic_measurements m(job, 3);
  const plan start = pipeline_plan(job, m);
  rebalance_policy policy(job, m, start, on());
  emulated_run em(job, m);
  EXPECT_TRUE(run(policy, em, 0, 200).empty());
  EXPECT_EQ(policy.current(), start);
  EXPECT_EQ(policy.status().evaluated_step, 199);
  EXPECT_NEAR(policy.status().gain, 0, 1e-12);
}

TEST(scheduler_rebalance, noisy_steady_speeds_never_rebalance) {
  auto job = two_kinds_job();
  synthetic_measurements m(job, 3);
  const plan start = pipeline_plan(job, m);
  for (std::uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("noise seed " + std::to_string(seed));
    rebalance_policy policy(job, m, start, on());
    emulated_run em(job, m, 0.1, seed);
    double most = 0;
    for (int step = 0; step < 200; ++step) {
      EXPECT_FALSE(policy.observe(em.step(start, step))) << "step " << step;
      most = std::max(most, policy.status().net_gain);
    }
    std::printf("[ info ] noise 0.1, seed %d: largest net gain seen %.4f\n",
                static_cast<int>(seed), most);
  }
}

// ---------------------------------------------------------------------------
// Recovery

struct throttle_case {
  double noise;
  std::uint64_t seed;
};

class scheduler_rebalance_throttle
    : public ::testing::TestWithParam<throttle_case> {};

TEST_P(scheduler_rebalance_throttle, recovers_once_within_twenty_steps) {
  const auto param = GetParam();
  auto job = two_kinds_job();
  synthetic_measurements m(job, 3);
  const plan start = pipeline_plan(job, m);
  rebalance_policy policy(job, m, start, on());
  ASSERT_EQ(plan_chips(start).size(), 4u) << "every chip in the pipeline";
  emulated_run em(job, m, param.noise, param.seed);
  const int k = 50;
  const chip_id slow = c11; // the middle stage with the most blocks
  ASSERT_TRUE(run(policy, em, 0, k).empty());
  em.throttle(slow, 2.0);
  auto proposals = run(policy, em, k, 20);
  ASSERT_EQ(proposals.size(), 1u);
  const rebalance_proposal p = proposals.front();
  EXPECT_EQ(p.reason, "throttled chip 1:1");
  EXPECT_LT(stage_of(p.value, slow).num_layers(),
            stage_of(start, slow).num_layers());
  EXPECT_FALSE(p.moves.empty());
  for (const auto& mv : p.moves)
    EXPECT_NE(mv.to, slow) << "no layer moves to the throttled chip";
  EXPECT_GT(p.net_gain, policy.config().threshold);
  auto t = truth_of(job, m, em.slowdown(), p.value, start);
  auto before = truth_of(job, m, em.slowdown(), start, start);
  EXPECT_TRUE(t.fits);
  EXPECT_LE(t.step_seconds, 1.10 * t.best_seconds);
  std::printf("[ info ] throttle 2x at step %d, noise %.1f: proposal at step "
              "%d (%s), predicted gain %.1f%%; true step %s -> %s, best %s\n",
              k, param.noise, p.step, p.reason.c_str(), 100 * p.gain,
              scheduler::seconds_text(before.step_seconds).c_str(),
              scheduler::seconds_text(t.step_seconds).c_str(),
              scheduler::seconds_text(t.best_seconds).c_str());
  // No oscillation while the speeds stay.
  EXPECT_TRUE(run(policy, em, k + 20, 200).empty());
  // The chip recovers: one rebalance back, then quiet again.
  em.throttle(slow, 1.0);
  proposals = run(policy, em, k + 220, 20);
  ASSERT_EQ(proposals.size(), 1u);
  EXPECT_EQ(proposals.front().reason, "recovered chip 1:1");
  EXPECT_GT(stage_of(policy.current(), slow).num_layers(),
            stage_of(p.value, slow).num_layers());
  EXPECT_TRUE(run(policy, em, k + 240, 200).empty());
}

INSTANTIATE_TEST_SUITE_P(
  noise, scheduler_rebalance_throttle,
  ::testing::Values(throttle_case{0, 1}, throttle_case{0.1, 7},
                    throttle_case{0.1, 8}),
  [](const ::testing::TestParamInfo<throttle_case>& info) {
    return (info.param.noise == 0 ? std::string("steady")
                                  : std::string("noise_0_1")) +
           "_seed_" + std::to_string(info.param.seed);
  });

// Two replicas of two chips of one kind: a throttled chip's replica gives
// layers to its partner or sequences to the other replica.
TEST(scheduler_rebalance, replicas_recover_from_a_throttle) {
  std::vector<kind_spec> kinds{{"a", "V", 300, 64, 200, 5e-6}};
  auto job = parse_job(job_toml(kinds, {{"a", "a"}, {"a", "a"}}, 10, 8,
                                schedule_kind::one_f_one_b, 1.0),
                       "replicas");
  synthetic_measurements m(job, 5);
  plan two;
  two.schedule = schedule_kind::one_f_one_b;
  for (const auto& [x, y] : {std::pair{c00, c01}, std::pair{c10, c11}}) {
    replica_plan r;
    r.micro_batch_size = 1;
    r.micro_batches = 4;
    r.stages = {{x, 0, 6, false}, {y, 6, 12, false}};
    two.replicas.push_back(r);
  }
  auto best = best_plan_within(job, m, two);
  ASSERT_TRUE(best);
  const plan start = best->value;
  ASSERT_EQ(plan_chips(start), plan_chips(two)) << "chips and order kept";
  rebalance_policy policy(job, m, start, on());
  emulated_run em(job, m, 0.1, 11);
  ASSERT_TRUE(run(policy, em, 0, 30).empty());
  em.throttle(c01, 2.0);
  auto proposals = run(policy, em, 30, 20);
  ASSERT_EQ(proposals.size(), 1u);
  const auto& p = proposals.front();
  EXPECT_EQ(plan_chips(p.value), plan_chips(start));
  auto t = truth_of(job, m, em.slowdown(), p.value, start);
  EXPECT_TRUE(t.fits);
  EXPECT_LE(t.step_seconds, 1.10 * t.best_seconds);
  const auto& r0 = p.value.replicas[0];
  const bool fewer_layers =
    stage_of(p.value, c01).num_layers() < stage_of(start, c01).num_layers();
  const bool fewer_sequences = r0.sequences() < start.replicas[0].sequences();
  EXPECT_TRUE(fewer_layers || fewer_sequences);
  std::printf("[ info ] replicas: replica 0 %d sequences (was %d), chip 0:1 "
              "%d layers (was %d); true step within %.1f%% of the best\n",
              r0.sequences(), start.replicas[0].sequences(),
              stage_of(p.value, c01).num_layers(),
              stage_of(start, c01).num_layers(),
              100 * (t.step_seconds / t.best_seconds - 1));
  EXPECT_TRUE(run(policy, em, 50, 200).empty());
}

// The demo's start: the even plan on chips of two speeds is rebalanced
// from live metrics at once, and then left alone.
TEST(scheduler_rebalance, even_start_rebalances_from_live_metrics_once) {
  auto job = two_kinds_job();
  synthetic_measurements m(job, 3);
  const plan start = scheduler::even_plan(job, {c00, c01, c10, c11});
  rebalance_policy policy(job, m, start, on());
  emulated_run em(job, m);
  auto proposals = run(policy, em, 0, 200);
  ASSERT_EQ(proposals.size(), 1u);
  EXPECT_EQ(proposals.front().step, policy.config().window - 1);
  EXPECT_EQ(proposals.front().reason, "live metrics");
  auto t = truth_of(job, m, {}, proposals.front().value, start);
  EXPECT_NEAR(t.step_seconds, t.best_seconds, 1e-9 * t.best_seconds);
}

// ---------------------------------------------------------------------------
// Memory

// Memory tight enough that the best plan for the throttled cluster without
// a memory limit does not fit: what the policy proposes fits.
TEST(scheduler_rebalance, never_proposes_a_plan_that_does_not_fit) {
  auto roomy = two_kinds_job(1.0);
  synthetic_measurements m0(roomy, 3);
  const plan start = pipeline_plan(roomy, m0);
  // The throttled chip whose unconstrained best needs the most memory
  // relative to the start.
  auto peak_ratio = [&](const job_config& job, const plan& p) {
    planner pl(job, m0);
    auto rep = pl.evaluate(p);
    double most = 0;
    for (const auto& r : rep.replicas)
      for (const auto& s : r.stages)
        most = std::max(most, s.peak_bytes / s.capacity_bytes);
    return most;
  };
  const double at_start = peak_ratio(roomy, start);
  chip_id victim;
  double tightest = 0;
  plan unconstrained;
  for (const auto& c : plan_chips(start)) {
    std::map<chip_id, double> slow{{c, 2.0}};
    job_config tj = truth_job(roomy, slow);
    true_measurements tm(roomy, m0, slow);
    auto best = best_plan_within(tj, tm, start);
    ASSERT_TRUE(best);
    const double r = peak_ratio(roomy, best->value);
    if (r > tightest) {
      tightest = r;
      victim = c;
      unconstrained = best->value;
    }
  }
  ASSERT_GT(tightest, at_start * 1.05) << "no throttle needs more memory";
  // memory_scale multiplies every chip's capacity: one between the two
  // shares, so that the start fits and that best does not.
  auto job = two_kinds_job(0.5 * (at_start + tightest));
  synthetic_measurements m(job, 3);
  ASSERT_TRUE(planner(job, m).evaluate(start).fits);
  ASSERT_FALSE(planner(job, m).evaluate(unconstrained).fits);

  rebalance_policy policy(job, m, start, on());
  emulated_run em(job, m);
  ASSERT_TRUE(run(policy, em, 0, 10).empty());
  em.throttle(victim, 2.0);
  auto proposals = run(policy, em, 10, 100);
  EXPECT_FALSE(proposals.empty()) << "a throttle still pays within memory";
  for (const auto& p : proposals) {
    EXPECT_TRUE(planner(job, m).evaluate(p.value).fits);
    EXPECT_TRUE(p.report.fits);
    EXPECT_NE(p.value, unconstrained);
    // As good as the best plan that fits (brute force in the tight job).
    auto t = truth_of(job, m, em.slowdown(), p.value, start);
    EXPECT_TRUE(t.fits);
    EXPECT_LE(t.step_seconds, 1.10 * t.best_seconds);
  }
  std::printf("[ info ] memory: chip %s throttled, %zu proposal(s) that fit "
              "(the unconstrained best needs %.2fx the start's peak share)\n",
              victim.to_string().c_str(), proposals.size(),
              tightest / at_start);
}

// A chip whose runtime needs more than the memory model predicts: the
// policy plans with its capacity divided by the observed excess.
TEST(scheduler_rebalance, observed_memory_shrinks_what_a_chip_may_take) {
  auto job = two_kinds_job();
  synthetic_measurements m(job, 3);
  const plan start = pipeline_plan(job, m);
  live_calibration cal(job, m, 1.0);
  emulated_run em(job, m);
  em.memory_factor(c10, 1.5);
  cal.add(start, em.step(start, 0));
  EXPECT_DOUBLE_EQ(cal.memory_factor(c10), 1.5);
  EXPECT_DOUBLE_EQ(cal.memory_factor(c00), 1.0);
  auto live = scheduler::live_job(cal);
  scheduler::cost_model original(job, m), shrunk(live, m);
  EXPECT_NEAR(shrunk.capacity_bytes(*live.find_chip(c10)),
              original.capacity_bytes(*job.find_chip(c10)) / 1.5,
              original.capacity_bytes(*job.find_chip(c10)) * 1e-9);
  EXPECT_EQ(shrunk.capacity_bytes(*live.find_chip(c00)),
            original.capacity_bytes(*job.find_chip(c00)));
}

// ---------------------------------------------------------------------------
// Switch and cost

TEST(scheduler_rebalance, policy_off_never_proposes) {
  auto job = two_kinds_job();
  synthetic_measurements m(job, 3);
  const plan start = pipeline_plan(job, m);
  rebalance_config off;
  ASSERT_EQ(off.policy, rebalance_mode::off) << "off by default";
  rebalance_policy policy(job, m, start, off);
  emulated_run em(job, m);
  ASSERT_TRUE(run(policy, em, 0, 10).empty());
  em.throttle(c11, 2.0);
  EXPECT_TRUE(run(policy, em, 10, 100).empty());
  EXPECT_EQ(policy.current(), start);
  EXPECT_EQ(policy.status().evaluated_step, -1) << "nothing evaluated";
  // The admin asks: the calibration kept running.
  auto asked = policy.propose_now(110);
  ASSERT_TRUE(asked);
  EXPECT_EQ(asked->reason, "admin");
  EXPECT_LT(stage_of(asked->value, c11).num_layers(),
            stage_of(start, c11).num_layers());
  // Switched on, it proposes by itself (after min_interval from the ask).
  policy.set_mode(rebalance_mode::automatic);
  auto proposals = run(policy, em, 111, 20);
  ASSERT_EQ(proposals.size(), 1u);
  EXPECT_GE(proposals.front().step, 110 + policy.config().min_interval);
}

// Links slow enough that moving a block costs a fraction of a step: a
// moderate gain pays for the move when amortised over 50 steps, not over 2.
TEST(scheduler_rebalance, move_cost_blocks_a_small_gain) {
  const std::string slow_links = "[topology]\n[topology.same_node]\n"
                                 "bandwidth_gb_per_s = 0.5\n"
                                 "[topology.between_hosts]\n"
                                 "bandwidth_gb_per_s = 0.5\n";
  auto outcome = [&](int min_interval) {
    auto job = two_kinds_job(1.0, slow_links);
    synthetic_measurements m(job, 3);
    const plan start = pipeline_plan(job, m);
    auto config = on();
    config.min_interval = min_interval;
    rebalance_policy policy(job, m, start, config);
    emulated_run em(job, m);
    em.throttle(c11, 1.5);
    auto proposals = run(policy, em, 0, 40);
    return std::make_pair(proposals, policy.status());
  };
  auto [long_run, long_status] = outcome(50);
  ASSERT_EQ(long_run.size(), 1u);
  const auto& p = long_run.front();
  EXPECT_GT(p.move_seconds, 0);
  EXPECT_GT(p.moved_bytes, 0);
  EXPECT_GT(p.gain, 0.05);
  EXPECT_NEAR(p.net_gain, p.gain - p.move_seconds / 50 / p.before_seconds,
              1e-12);
  auto [short_run, short_status] = outcome(2);
  EXPECT_TRUE(short_run.empty());
  EXPECT_GT(short_status.gain, 0.05) << "the gain alone would pass";
  EXPECT_LE(short_status.net_gain, 0.05);
  std::printf("[ info ] move of %.0f KiB in %s; gain %.1f%%, net %.1f%% over "
              "50 steps, %.1f%% over 2\n",
              p.moved_bytes / 1024,
              scheduler::seconds_text(p.move_seconds).c_str(), 100 * p.gain,
              100 * p.net_gain, 100 * short_status.net_gain);
}

// ---------------------------------------------------------------------------
// The pieces

TEST(scheduler_rebalance, ewma_smooths) {
  scheduler::ewma e(0.5);
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(e.add(2.0), 2.0);
  EXPECT_EQ(e.add(4.0), 3.0);
  EXPECT_EQ(e.add(4.0), 3.5);
  EXPECT_EQ(e.samples(), 3);
}

TEST(scheduler_rebalance, config_keys_and_ranges) {
  EXPECT_EQ(scheduler::parse_rebalance_mode("auto"), rebalance_mode::automatic);
  EXPECT_EQ(scheduler::parse_rebalance_mode("off"), rebalance_mode::off);
  EXPECT_FALSE(scheduler::parse_rebalance_mode("on"));
  EXPECT_EQ(scheduler::to_string(rebalance_mode::automatic), "auto");
  scheduler::check_rebalance_config({});
  auto key_of = [](rebalance_config c) {
    try {
      scheduler::check_rebalance_config(c);
    } catch (const config_error& e) {
      return e.key_path();
    }
    return std::string();
  };
  rebalance_config c;
  c.threshold = -0.1;
  EXPECT_EQ(key_of(c), "rebalance.threshold");
  c = {};
  c.window = 0;
  EXPECT_EQ(key_of(c), "rebalance.window");
  c = {};
  c.min_interval = -1;
  EXPECT_EQ(key_of(c), "rebalance.min_interval");
  c = {};
  c.smoothing = 0;
  EXPECT_EQ(key_of(c), "rebalance.smoothing");
}

TEST(scheduler_rebalance, layer_moves_count_state_and_links) {
  auto job = two_kinds_job(
    1.0, "[topology]\n[topology.between_hosts]\nbandwidth_gb_per_s = 2\n"
         "latency_seconds = 1e-4\n");
  plan from = scheduler::even_plan(job, {c00, c01, c10, c11});
  plan to = from;
  auto& st = to.replicas[0].stages;
  // Layers [0, 12): even is [0,3) [3,6) [6,9) [9,12). Move layer 5 from
  // 0:1 to 1:0 and layers 0..1 stay; 0:0 takes layer 3 from 0:1.
  st = {{c00, 0, 4, false},
        {c01, 4, 5, false},
        {c10, 5, 9, false},
        {c11, 9, 12, false}};
  auto moves = scheduler::layer_moves(job, from, to);
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_EQ(moves[0].from, c01);
  EXPECT_EQ(moves[0].to, c00);
  EXPECT_EQ(moves[0].first_layer, 3);
  EXPECT_EQ(moves[0].end_layer, 4);
  EXPECT_EQ(moves[1].from, c01);
  EXPECT_EQ(moves[1].to, c10);
  EXPECT_EQ(moves[1].first_layer, 5);
  EXPECT_EQ(moves[1].end_layer, 6);
  const double block_bytes =
    12.0 * static_cast<double>(layer_parameters(job.model, 3));
  EXPECT_DOUBLE_EQ(moves[0].bytes, block_bytes);
  // Between hosts: 2 GB/s and 100 us of latency.
  EXPECT_NEAR(moves[1].seconds, 1e-4 + block_bytes / 2e9, 1e-12);
  EXPECT_TRUE(scheduler::layer_moves(job, from, from).empty());
  plan other = from;
  std::swap(other.replicas[0].stages[0].chip, other.replicas[0].stages[1].chip);
  EXPECT_THROW(scheduler::layer_moves(job, from, other), internal_error);
}

TEST(scheduler_rebalance, calibration_scales_measurements_per_chip) {
  auto job = two_kinds_job();
  synthetic_measurements m(job, 3);
  const plan start = pipeline_plan(job, m);
  live_calibration cal(job, m, 1.0);
  emulated_run em(job, m);
  em.throttle(c01, 2.0);
  cal.add(start, em.step(start, 0));
  EXPECT_DOUBLE_EQ(cal.forward_factor(c01, layer_kind::block), 2.0);
  EXPECT_DOUBLE_EQ(cal.backward_factor(c01, layer_kind::block), 2.0);
  EXPECT_DOUBLE_EQ(cal.optimizer_factor(c01), 2.0);
  EXPECT_DOUBLE_EQ(cal.forward_factor(c00, layer_kind::block), 1.0);
  EXPECT_DOUBLE_EQ(cal.forward_factor(c00, layer_kind::embedding), 1.0);
  // A kind the chip has not run takes its pooled factor.
  EXPECT_DOUBLE_EQ(cal.forward_factor(c01, layer_kind::embedding), 2.0);
  EXPECT_NEAR(cal.compute_factor(c01), 2.0, 1e-12);
  auto live = scheduler::live_job(cal);
  EXPECT_EQ(live.find_chip(c00)->profile.name, "a") << "alike chips stay alike";
  EXPECT_NE(live.find_chip(c01)->profile.name, "a");
  scheduler::live_measurements lm(cal);
  auto t = lm.layer(*live.find_chip(c01), layer_kind::block, 2);
  auto p = m.layer(*job.find_chip(c01), layer_kind::block, 2);
  EXPECT_DOUBLE_EQ(t.forward_seconds, 2 * p.forward_seconds);
  // An observation that does not match the plan is a caller's bug.
  auto obs = em.step(start, 1);
  obs.chips.front().layers.pop_back();
  EXPECT_THROW(cal.add(start, obs), internal_error);
}

TEST(scheduler_rebalance, best_plan_within_keeps_chips_and_order) {
  auto job = two_kinds_job();
  synthetic_measurements m(job, 3);
  // A deliberately odd order: slow, fast, slow, fast.
  plan odd = scheduler::even_plan(job, {c00, c10, c01, c11});
  auto best = best_plan_within(job, m, odd);
  ASSERT_TRUE(best);
  EXPECT_EQ(plan_chips(best->value), plan_chips(odd));
  EXPECT_LE(best->report.step_seconds,
            planner(job, m).evaluate(odd).step_seconds);
  // Brute force over the same limits agrees.
  auto t = truth_of(job, m, {}, best->value, odd);
  EXPECT_NEAR(t.step_seconds, t.best_seconds, 1e-9 * t.best_seconds);
}

} // namespace
} // namespace h2::test
