// Checkpoints of a job in one process (docs/checkpoints.md): a run to step
// N equals a run stopped at step K, saved, and resumed to N, bit for bit in
// every loss, every parameter and every AdamW moment, also when the resumed
// run has another plan (other stage boundaries, another number of chips,
// one or two data-parallel replicas); with three or more replicas, within
// the bound of fp32 reassociation (issue 11, "Resume on another plan").
#include "h2/actors/local_job.hpp"
#include "h2/core/files.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/checkpointing.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "shard_fixture.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

namespace h2::test {
namespace {

namespace fs = std::filesystem;

/// Concatenates the losses of a stopped run and of its resumption.
std::vector<double> joined(std::vector<double> first,
                           const std::vector<double>& second) {
  first.insert(first.end(), second.begin(), second.end());
  return first;
}

class actors_checkpoint : public ::testing::Test {
protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("h2-checkpoint-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(root_);
  }
  void TearDown() override { h2::remove_tree(root_); }

  /// Four chips of three kinds at their default dtype (bf16 compute), 4
  /// steps, checkpoints under `dir`.
  std::shared_ptr<job_config> job(const std::string& dir) const {
    auto j = std::make_shared<job_config>(parse_job(small_job_toml(13) + R"(
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x", "emulated:a100-sxm-80gb",
         "emulated:mi300x"]
[plan]
mode = "manual"
stages = ["0:0", "0:1"]
layers = [3, 3]
[checkpoint]
dir = ")" + (root_ / dir).string() + R"("
)",
                                                    "checkpoint.toml"));
    j->train.steps = 4;
    return j;
  }

  /// Four fp32 chips of three kinds for plans with replicas (built by hand:
  /// the [plan] below is only the job file's), tiny all-reduce buckets so
  /// that every layer's gradients travel in several, 4 steps, checkpoints
  /// under `dir`. fp32 compute, the precision the bitwise claims are about
  /// (without dtype, emulated chips compute in bf16).
  std::shared_ptr<job_config> job_for_replicas(const std::string& dir) const {
    auto j = std::make_shared<job_config>(parse_job(small_job_toml(13) + R"(
[transport]
bucket_mb = 0.001
[[nodes]]
chips = [{device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:mi250x", dtype = "fp32"},
         {device = "emulated:a100-sxm-80gb", dtype = "fp32"},
         {device = "emulated:mi300x", dtype = "fp32"}]
[plan]
mode = "manual"
stages = ["0:0", "0:1"]
layers = [3, 3]
[checkpoint]
dir = ")" + (root_ / dir).string() + R"("
)",
                                                    "replicas.toml"));
    j->train.steps = 4;
    return j;
  }

  struct outcome {
    std::vector<double> losses;
    std::vector<runtime::parameter_values> params;
  };

  /// Runs `j` under `p` until `steps` steps are done, from `resume`.
  static outcome run(const std::shared_ptr<job_config>& j, const plan& p,
                     int steps,
                     std::shared_ptr<const runtime::checkpoint> resume = {}) {
    actors::local_job local(j, p);
    runtime::step_recorder recorder;
    actors::run_options o;
    o.steps = steps;
    o.collect_parameters = true;
    o.resume = std::move(resume);
    o.job_text = "# test job\n";
    local.run(o, recorder);
    return {recorder.losses(), local.parameters()};
  }

  /// The checkpoint latest_checkpoint finds under `dir`.
  std::shared_ptr<const runtime::checkpoint> latest(const std::string& dir) {
    auto found = runtime::latest_checkpoint(root_ / dir, nullptr);
    EXPECT_TRUE(found.has_value()) << "no checkpoint under " << dir;
    return std::make_shared<runtime::checkpoint>(
      runtime::read_checkpoint(*found));
  }

  /// Trains job_for_replicas("split") to step 2 under `before` (saving
  /// there), then resumes it under `after` to step 4: the losses of both
  /// parts, and the final parameters.
  outcome stopped_and_resumed(const plan& before, const plan& after) {
    auto j = job_for_replicas("split");
    const auto first = run(j, before, 2);
    auto second = run(j, after, 4, latest("split"));
    second.losses = joined(first.losses, second.losses);
    return second;
  }

  fs::path root_;
};

/// Bitwise: float == would take -0 for +0.
void expect_same_parameters(const std::vector<runtime::parameter_values>& a,
                            const std::vector<runtime::parameter_values>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    ASSERT_EQ(a[i].values.size(), b[i].values.size()) << a[i].name;
    EXPECT_EQ(0, std::memcmp(a[i].values.data(), b[i].values.data(),
                             a[i].values.size() * sizeof(float)))
      << a[i].name;
  }
}

/// Every tensor of two checkpoints (parameters and AdamW moments) holds the
/// same bytes; there are moments to compare.
void expect_same_state(const runtime::checkpoint& a,
                       const runtime::checkpoint& b) {
  EXPECT_EQ(a.manifest.step, b.manifest.step);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  std::size_t moments = 0;
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    const auto& ta = a.layers[l].tensors;
    const auto& tb = b.layers[l].tensors;
    ASSERT_EQ(ta.size(), tb.size()) << "layer " << l;
    for (std::size_t t = 0; t < ta.size(); ++t) {
      EXPECT_EQ(ta[t].name, tb[t].name);
      EXPECT_EQ(ta[t].dtype, tb[t].dtype) << ta[t].name;
      EXPECT_EQ(ta[t].shape, tb[t].shape) << ta[t].name;
      EXPECT_TRUE(ta[t].bytes == tb[t].bytes) << ta[t].name;
      if (ta[t].name.ends_with(".exp_avg") ||
          ta[t].name.ends_with(".exp_avg_sq"))
        ++moments;
    }
  }
  EXPECT_GT(moments, 0u);
}

/// Largest and mean absolute difference of two runs' parameters.
struct parameter_difference {
  double max = 0;
  double mean = 0;
};

parameter_difference
difference(const std::vector<runtime::parameter_values>& a,
           const std::vector<runtime::parameter_values>& b) {
  parameter_difference d;
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].values.size(), b[i].values.size()) << a[i].name;
    for (std::size_t j = 0;
         j < std::min(a[i].values.size(), b[i].values.size()); ++j) {
      const double x = std::abs(static_cast<double>(a[i].values[j]) -
                                static_cast<double>(b[i].values[j]));
      d.max = std::max(d.max, x);
      sum += x;
      ++n;
    }
  }
  d.mean = n > 0 ? sum / static_cast<double>(n) : 0;
  return d;
}

/// The bound for a run whose gradients were summed in another order than
/// the reference's, the reasoning of tests/actors/replicas_test
/// (expect_close_to_reference), with its constants.
///
/// When the order is the same, runs are bitwise equal. A replica adds its
/// micro-batches' gradients in order, ((0 + g1) + g2) + ..., and the ring
/// all-reduce of two members adds a + b on one and b + a on the other, the
/// same number. So two replicas (a micro-batches, then b) equal one replica
/// of the same a + b micro-batches of the same size exactly when b = 1:
/// (g1 + ... + ga) + g(a+1) is the one replica's running sum. With two
/// micro-batches in the second replica, (g1 + g2) + (g3 + g4) is not
/// ((g1 + g2) + g3) + g4; with three or more members the ring adds the
/// partial sums starting at another member for each share of each bucket.
/// (Another micro-batch size also rounds differently, in the forward pass
/// already.)
///
/// Otherwise: a reassociation of a few fp32 terms, relative error ~1e-7
/// per gradient element. A step's loss is a sum of fp32 terms whose inputs
/// moved by as little: within 1e-5 relative. AdamW turns a gradient into a
/// step of about lr whatever its size, so where a gradient is near zero a
/// tiny difference can flip the step: at most 2 lr per step, 2 lr x steps
/// in all (lr: the peak, train.lr); the mean difference stays orders of
/// magnitude below it, 1e-4 lr.
void expect_within_reassociation(
  const job_config& job, const std::vector<double>& losses,
  const std::vector<double>& reference_losses,
  const std::vector<runtime::parameter_values>& params,
  const std::vector<runtime::parameter_values>& reference_params) {
  ASSERT_EQ(losses.size(), reference_losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], reference_losses[i], 1e-5 * reference_losses[i])
      << "step " << i + 1;
  const auto d = difference(params, reference_params);
  EXPECT_LE(d.max, 2 * job.train.lr * job.train.steps);
  EXPECT_LE(d.mean, 1e-4 * job.train.lr);
}

stage_plan stage(int chip, int first, int end) {
  return stage_plan{chip_id{0, chip}, first, end, false};
}

/// A plan of `replicas`, validated against `job`.
plan replica_plan_of(const job_config& job, std::vector<replica_plan> replicas,
                     const std::string& origin) {
  plan p;
  p.schedule = schedule_kind::one_f_one_b;
  p.replicas = std::move(replicas);
  validate_plan(p, job, origin);
  return p;
}

TEST_F(actors_checkpoint, stop_save_and_resume_equals_one_run) {
  auto whole_job = job("whole");
  const plan p = scheduler::make_plan(*whole_job);
  const auto whole = run(whole_job, p, 4); // saves step 4 at its end
  ASSERT_EQ(whole.losses.size(), 4u);

  auto split_job = job("split");
  const auto first = run(split_job, p, 2); // --stop-after 2
  const auto saved = latest("split");
  EXPECT_EQ(saved->manifest.step, 2);
  EXPECT_EQ(saved->layers.size(), 6u);
  const auto second = run(split_job, p, 4, saved);

  std::vector<double> losses = first.losses;
  losses.insert(losses.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(losses, whole.losses); // bitwise
  expect_same_parameters(second.params, whole.params);
  // Moments too: the two step-4 checkpoints hold the same state.
  const auto a = latest("whole");
  const auto b = latest("split");
  EXPECT_EQ(a->manifest.step, 4);
  EXPECT_EQ(b->manifest.step, 4);
  EXPECT_TRUE(a->layers == b->layers);
}

// Token shards (docs/data.md): a llama resumed from step 3 reads exactly
// the batches the straight run read, across an epoch boundary (the corpus
// holds 18 training windows, a step reads 8), and the checkpoint records
// where the data stands. Shards re-made by another tokenizer are refused.
TEST_F(actors_checkpoint, shards_resume_with_the_next_batch) {
  const auto shards = root_ / "shards";
  fs::create_directories(shards);
  write_test_shards(shards, {41, 33, 81}, 17); // 19 windows of 9
  auto text = small_job_toml(13, small_llama_model_toml);
  text.replace(text.find("source = \"markov\"\nentropy_rate = 1.0"),
               std::string("source = \"markov\"\nentropy_rate = 1.0").size(),
               "source = \"shards\"\nshards = \"" + shards.string() + "\"");
  auto job_text = [&](const std::string& dir) {
    return text + R"(
[[nodes]]
chips = [{device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:mi250x", dtype = "fp32"}]
[plan]
mode = "manual"
stages = ["0:0", "0:1"]
layers = [3, 3]
[checkpoint]
dir = ")" + (root_ / dir).string() +
           "\"\n";
  };
  auto make = [&](const std::string& dir) {
    auto j =
      std::make_shared<job_config>(parse_job(job_text(dir), "shards.toml"));
    j->train.steps = 5;
    return j;
  };
  auto whole_job = make("whole");
  const plan p = scheduler::make_plan(*whole_job);
  const auto whole = run(whole_job, p, 5);
  auto split_job = make("split");
  const auto first = run(split_job, p, 3);
  const auto saved = latest("split");
  EXPECT_EQ(saved->manifest.data.at("sequences"), 24);
  EXPECT_EQ(saved->manifest.data.at("train_windows"), 18);
  EXPECT_EQ(saved->manifest.data.at("epoch"), 1);
  EXPECT_EQ(saved->manifest.data.at("position_in_epoch"), 6);
  const auto second = run(split_job, p, 5, saved);
  EXPECT_EQ(joined(first.losses, second.losses), whole.losses); // bitwise
  expect_same_parameters(second.params, whole.params);

  // The same corpus under another tokenizer: refused, naming it.
  write_test_shards(shards, {41, 33, 81}, 17, "another tokenizer");
  auto manifest = saved->manifest;
  manifest.job_toml = job_text("split");
  try {
    runtime::check_resumable(manifest, *split_job, "ckpt");
    ADD_FAILURE() << "resumed on shards of another tokenizer";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("data.shards (tokenizer): "),
              std::string::npos)
      << e.what();
  }
}

TEST_F(actors_checkpoint, resume_on_another_plan_and_schedule_equals_one_run) {
  auto whole_job = job("whole");
  const auto whole = run(whole_job, scheduler::make_plan(*whole_job), 4);

  // Saved under two stages [3, 3] of 1f1b, resumed on three chips [1, 2, 3]
  // under zb-h1: the per-layer state does not depend on the schedule.
  auto split_job = job("split");
  run(split_job, scheduler::make_plan(*split_job), 2);
  plan three = scheduler::make_plan(*split_job);
  auto& stages = three.replicas[0].stages;
  stages = {{chip_id{0, 2}, 0, 1, false},
            {chip_id{0, 3}, 1, 3, false},
            {chip_id{0, 0}, 3, 6, false}};
  three.schedule = schedule_kind::zb_h1;
  validate_plan(three, *split_job, "three-stage plan");
  const auto second = run(split_job, three, 4, latest("split"));
  EXPECT_EQ(second.losses,
            std::vector<double>(whole.losses.begin() + 2, whole.losses.end()));
  expect_same_parameters(second.params, whole.params);
}

TEST_F(actors_checkpoint, resume_under_interleaved_and_back_equals_one_run) {
  auto whole_job = job("whole");
  const auto whole = run(whole_job, scheduler::make_plan(*whole_job), 6);

  // Saved under 1f1b [3, 3] at step 2; steps 3-4 under interleaved-1f1b
  // with two chunks on each of the same chips; steps 5-6 under 1f1b again:
  // a checkpoint holds layers, not chunks.
  auto split_job = job("split");
  const plan one_chunk = scheduler::make_plan(*split_job);
  run(split_job, one_chunk, 2);
  plan interleaved = one_chunk;
  interleaved.schedule = schedule_kind::interleaved_1f1b;
  interleaved.replicas[0].stages = {{chip_id{0, 0}, 0, 2, false},
                                    {chip_id{0, 1}, 2, 3, false},
                                    {chip_id{0, 0}, 3, 5, false},
                                    {chip_id{0, 1}, 5, 6, false}};
  scheduler::check_plan(interleaved, *split_job, "interleaved plan");
  const auto second = run(split_job, interleaved, 4, latest("split"));
  const auto third = run(split_job, one_chunk, 6, latest("split"));
  EXPECT_EQ(second.losses, std::vector<double>(whole.losses.begin() + 2,
                                               whole.losses.begin() + 4));
  EXPECT_EQ(third.losses,
            std::vector<double>(whole.losses.begin() + 4, whole.losses.end()));
  expect_same_parameters(third.params, whole.params);
}

// Two replicas whose second has one micro-batch sum every gradient as one
// replica of the same micro-batches does (see expect_within_reassociation):
// a run that changes between them at a checkpoint equals one that never
// changes, bit for bit, in every loss, parameter and AdamW moment.
TEST_F(actors_checkpoint, resume_on_two_replicas_equals_one_run) {
  auto whole_job = job_for_replicas("whole");
  const plan one = replica_plan_of(
    *whole_job, {{{stage(0, 0, 3), stage(1, 3, 6)}, 2, 4}}, "one replica");
  const auto whole = run(whole_job, one, 4);

  // Saved under one replica of two chips [3, 3], resumed on four chips:
  // two replicas cut [2, 4] (three micro-batches) and [4, 2] (one).
  const plan two = replica_plan_of(*whole_job,
                                   {{{stage(2, 0, 2), stage(3, 2, 6)}, 2, 3},
                                    {{stage(0, 0, 4), stage(1, 4, 6)}, 2, 1}},
                                   "two replicas");
  ASSERT_EQ(reduction_groups(two).size(), 3u);
  const auto split = stopped_and_resumed(one, two);

  EXPECT_EQ(split.losses, whole.losses); // bitwise
  expect_same_parameters(split.params, whole.params);
  expect_same_state(*latest("whole"), *latest("split"));
}

/// Two replicas of one micro-batch of 4, cut [3, 3] on chips 0:0, 0:1 and
/// [5, 1] on chips 0:2, 0:3.
plan two_replicas(const job_config& job) {
  return replica_plan_of(job,
                         {{{stage(0, 0, 3), stage(1, 3, 6)}, 4, 1},
                          {{stage(2, 0, 5), stage(3, 5, 6)}, 4, 1}},
                         "two replicas");
}

/// One replica of three chips [1, 2, 3], two micro-batches of 4.
plan three_stages(const job_config& job) {
  return replica_plan_of(
    job, {{{stage(3, 0, 1), stage(1, 1, 3), stage(2, 3, 6)}, 4, 2}},
    "three stages");
}

TEST_F(actors_checkpoint, resume_from_two_replicas_equals_one_run) {
  auto j = job_for_replicas("whole");
  const plan two = two_replicas(*j);
  const auto whole = run(j, two, 4);

  // Saved under two replicas on four chips, resumed on one replica of
  // three chips [1, 2, 3].
  const plan three = three_stages(*j);
  const auto split = stopped_and_resumed(two, three);

  EXPECT_EQ(split.losses, whole.losses); // bitwise
  expect_same_parameters(split.params, whole.params);
  expect_same_state(*latest("whole"), *latest("split"));
}

// ZeRO-1 (docs/planner.md, "Sharded optimizer state"): the replicas
// gather their shares of the moments for the save, so the checkpoint holds
// every layer's whole state, bitwise that of an unsharded run; it resumes
// on replicas cut elsewhere, sharded again, and on one unsharded replica.
TEST_F(actors_checkpoint, zero1_saves_whole_state_and_resumes_on_other_plans) {
  auto j = job_for_replicas("whole");
  const plan two = two_replicas(*j);
  const auto whole = run(j, two, 4);

  plan sharded = two, recut = two;
  sharded.zero1 = recut.zero1 = true;
  recut.replicas[0].stages = {stage(0, 0, 2), stage(1, 2, 6)};
  recut.replicas[1].stages = {stage(2, 0, 4), stage(3, 4, 6)};
  const auto split = stopped_and_resumed(sharded, recut);
  EXPECT_EQ(split.losses, whole.losses); // bitwise
  expect_same_parameters(split.params, whole.params);
  expect_same_state(*latest("whole"), *latest("split"));

  h2::remove_tree(root_ / "split");
  const plan three = three_stages(*j);
  const auto unsharded = stopped_and_resumed(sharded, three);
  EXPECT_EQ(unsharded.losses, whole.losses);
  expect_same_parameters(unsharded.params, whole.params);
  expect_same_state(*latest("whole"), *latest("split"));
}

// Two replicas of two micro-batches each add (a1 + a2) + (b1 + b2) where
// one replica adds ((a1 + a2) + b1) + b2: not bitwise, within the bound.
TEST_F(actors_checkpoint, two_replicas_of_two_micro_batches_within_bound) {
  auto whole_job = job_for_replicas("whole");
  const plan one = replica_plan_of(
    *whole_job, {{{stage(0, 0, 3), stage(1, 3, 6)}, 2, 4}}, "one replica");
  const auto whole = run(whole_job, one, 4);

  const plan two = replica_plan_of(*whole_job,
                                   {{{stage(2, 0, 2), stage(3, 2, 6)}, 2, 2},
                                    {{stage(0, 0, 4), stage(1, 4, 6)}, 2, 2}},
                                   "two replicas");
  const auto split = stopped_and_resumed(one, two);

  expect_within_reassociation(*whole_job, split.losses, whole.losses,
                              split.params, whole.params);
}

// Three or more replicas reassociate the gradient sums: within the bound
// of expect_within_reassociation, both ways.
TEST_F(actors_checkpoint, resume_on_three_replicas_within_reassociation) {
  auto whole_job = job_for_replicas("whole");
  const plan one = replica_plan_of(
    *whole_job, {{{stage(0, 0, 3), stage(1, 3, 6)}, 2, 4}}, "one replica");
  const auto whole = run(whole_job, one, 4);

  // Saved under one replica of two chips, resumed on three replicas of
  // four chips: two micro-batches on [4, 2], one on each whole-model chip.
  const plan three = replica_plan_of(*whole_job,
                                     {{{stage(0, 0, 4), stage(1, 4, 6)}, 2, 2},
                                      {{stage(2, 0, 6)}, 2, 1},
                                      {{stage(3, 0, 6)}, 2, 1}},
                                     "three replicas");
  const auto split = stopped_and_resumed(one, three);

  expect_within_reassociation(*whole_job, split.losses, whole.losses,
                              split.params, whole.params);
}

TEST_F(actors_checkpoint, resume_from_four_replicas_within_reassociation) {
  auto whole_job = job_for_replicas("whole");
  const plan three_stages = replica_plan_of(
    *whole_job, {{{stage(1, 0, 2), stage(2, 2, 3), stage(0, 3, 6)}, 2, 4}},
    "three stages");
  const auto whole = run(whole_job, three_stages, 4);

  // Saved under four replicas of one chip each, resumed on one replica of
  // three chips.
  const plan four = replica_plan_of(*whole_job,
                                    {{{stage(0, 0, 6)}, 2, 1},
                                     {{stage(1, 0, 6)}, 2, 1},
                                     {{stage(2, 0, 6)}, 2, 1},
                                     {{stage(3, 0, 6)}, 2, 1}},
                                    "four replicas");
  const auto split = stopped_and_resumed(four, three_stages);

  expect_within_reassociation(*whole_job, split.losses, whole.losses,
                              split.params, whole.params);
}

TEST_F(actors_checkpoint, saves_every_n_steps_and_keeps_the_newest) {
  auto j = job("every");
  j->checkpoint.every = 1;
  j->checkpoint.keep = 2;
  run(j, scheduler::make_plan(*j), 4);
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(root_ / "every"))
    dirs.push_back(e.path().filename().string());
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(dirs, (std::vector<std::string>{"step-00000003", "step-00000004"}));
}

} // namespace
} // namespace h2::test
