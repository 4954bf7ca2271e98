// Live re-plans (docs/rebalance.md): layers that move between the chips of
// a running job at step boundaries, with their AdamW moments, change
// nothing of the training: forced moves at two steps give bitwise the
// losses and final parameters of the run without them (fp32, one replica,
// the same micro-batching), and a checkpoint saved afterwards records the
// live plan. A re-plan that changes the chips is refused.
#include "h2/actors/local_job.hpp"
#include "h2/core/files.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include <unistd.h>

namespace h2::test {
namespace {

/// Three fp32 chips of three kinds, 6 layers, 5 steps, virtual clock.
std::shared_ptr<job_config> replan_job() {
  auto j = std::make_shared<job_config>(parse_job(small_job_toml(17) + R"(
[[nodes]]
chips = [{device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:mi250x", dtype = "fp32"},
         {device = "emulated:a100-sxm-80gb", dtype = "fp32"}]
)",
                                                  "replan.toml"));
  j->train.steps = 5;
  return j;
}

/// One replica over chips 0:0, 0:1, 0:2 holding `layers[i]` layers each,
/// 4 micro-batches of 2 sequences.
plan cut(const job_config& job, const std::vector<int>& layers) {
  return one_replica_plan(job, layers, 2, 4);
}

struct replan_outcome {
  std::vector<double> losses;
  std::vector<runtime::parameter_values> params;
  std::vector<std::vector<int>> stage_layers; ///< from each on_setup
  std::vector<runtime::rebalance_event> rebalances;
};

class setup_recorder : public runtime::step_recorder {
public:
  std::vector<std::vector<int>> setups;
  void on_setup(const plan& p,
                const std::vector<runtime::setup_report>&) override {
    std::vector<int> layers;
    for (const auto& s : p.replicas.front().stages)
      layers.push_back(s.num_layers());
    setups.push_back(layers);
  }
};

replan_outcome run(const std::shared_ptr<job_config>& job, const plan& p,
                   std::map<int, plan> replans) {
  actors::local_job local(job, p);
  setup_recorder recorder;
  actors::run_options o(job->train.steps, true);
  o.replans = std::move(replans);
  local.run(o, recorder);
  return {recorder.losses(), local.parameters(), recorder.setups,
          recorder.rebalances};
}

TEST(actors_replan, moved_layers_train_as_if_they_never_moved) {
  auto job = replan_job();
  const plan start = cut(*job, {2, 2, 2});
  const auto still = run(job, start, {});
  // The moved run saves its end: the checkpoint records the live plan.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("h2-replan-test-" + std::to_string(::getpid()));
  auto saving = std::make_shared<job_config>(*job);
  saving->checkpoint.dir = dir.string();
  const plan last = cut(*job, {4, 1, 1});
  const auto moved =
    run(saving, start, {{1, cut(*job, {1, 3, 2})}, {3, last}});
  const auto manifest =
    runtime::read_manifest(runtime::checkpoint_dir(dir, job->train.steps));
  h2::remove_tree(dir);
  EXPECT_EQ(manifest.plan_json, to_json(last, -1));

  EXPECT_EQ(moved.stage_layers, (std::vector<std::vector<int>>{
                                  {2, 2, 2}, {1, 3, 2}, {4, 1, 1}}));
  EXPECT_EQ(moved.losses, still.losses); // bitwise
  ASSERT_EQ(moved.params.size(), still.params.size());
  for (std::size_t i = 0; i < still.params.size(); ++i) {
    ASSERT_EQ(moved.params[i].name, still.params[i].name);
    ASSERT_EQ(moved.params[i].values.size(), still.params[i].values.size());
    EXPECT_EQ(std::memcmp(moved.params[i].values.data(),
                          still.params[i].values.data(),
                          still.params[i].values.size() * sizeof(float)),
              0)
      << still.params[i].name;
  }
}

/// interleaved-1f1b over chips 0:0 and 0:1, two chunks each (0:0 holds
/// stages 0 and 2), `layers` per stage, 4 micro-batches of 2 sequences.
plan interleaved_cut(const std::vector<int>& layers) {
  plan p;
  p.schedule = schedule_kind::interleaved_1f1b;
  replica_plan r;
  r.micro_batch_size = 2;
  r.micro_batches = 4;
  int next = 0;
  for (std::size_t s = 0; s < layers.size(); ++s) {
    r.stages.push_back(
      {chip_id{0, static_cast<int>(s % 2)}, next, next + layers[s], false});
    next += layers[s];
  }
  p.replicas.push_back(r);
  return p;
}

TEST(actors_replan, layers_moved_between_chunks_train_as_if_they_never_moved) {
  auto job = replan_job();
  const auto still = run(job, interleaved_cut({2, 1, 1, 2}), {});
  // Step 2: a layer of 0:0's first chunk moves to 0:1's first chunk; step
  // 4: layers move back and between 0:0's own chunks.
  const auto moved = run(
    job, interleaved_cut({2, 1, 1, 2}),
    {{2, interleaved_cut({1, 2, 1, 2})}, {4, interleaved_cut({1, 1, 3, 1})}});
  EXPECT_EQ(moved.stage_layers, (std::vector<std::vector<int>>{
                                  {2, 1, 1, 2}, {1, 2, 1, 2}, {1, 1, 3, 1}}));
  EXPECT_EQ(moved.losses, still.losses); // bitwise
  ASSERT_EQ(moved.params.size(), still.params.size());
  for (std::size_t i = 0; i < still.params.size(); ++i)
    EXPECT_EQ(moved.params[i].values, still.params[i].values)
      << still.params[i].name;
}

/// Bytes of layer `l`'s state: its fp32 values, and with `moments` both
/// AdamW moments of each.
double state_bytes(const job_config& job, int l, bool moments) {
  return (moments ? 12.0 : 4.0) *
         static_cast<double>(layer_parameters(job.model, l));
}

TEST(actors_replan, a_rebalance_sends_exactly_the_moved_layers_state) {
  auto job = replan_job();
  const plan start = cut(*job, {2, 2, 2});
  const auto still = run(job, start, {});
  // Before step 0 no moments exist yet; before step 3 they do.
  const auto moved =
    run(job, start, {{0, cut(*job, {1, 3, 2})}, {3, cut(*job, {3, 2, 1})}});
  EXPECT_EQ(moved.losses, still.losses); // bitwise
  ASSERT_EQ(moved.rebalances.size(), 2u);
  // [2, 2, 2] -> [1, 3, 2]: layer 1 moves 0:0 -> 0:1.
  // [1, 3, 2] -> [3, 2, 1]: layers 1 and 2 move 0:1 -> 0:0, layer 4
  // 0:2 -> 0:1.
  const double expected[] = {state_bytes(*job, 1, false),
                             state_bytes(*job, 1, true) +
                               state_bytes(*job, 2, true) +
                               state_bytes(*job, 4, true)};
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& e = moved.rebalances[i];
    EXPECT_EQ(e.route, "chip to chip");
    EXPECT_EQ(e.sent_bytes, expected[i]) << "re-plan " << i;
  }
  EXPECT_EQ(moved.rebalances[1].moved_bytes, expected[1]);
  EXPECT_EQ(moved.rebalances[1].moves,
            (std::vector<std::string>{"layers [1, 3) 0:1 -> 0:0",
                                      "layers [4, 5) 0:2 -> 0:1"}));
}

TEST(actors_replan, layers_that_skip_a_chip_go_through_the_scheduler) {
  auto job = replan_job();
  const plan start = cut(*job, {3, 1, 2});
  const auto still = run(job, start, {});
  // Layer 2 moves from 0:0 to 0:2, which share no channel.
  const auto moved = run(job, start, {{2, cut(*job, {1, 1, 4})}});
  EXPECT_EQ(moved.losses, still.losses); // bitwise
  ASSERT_EQ(moved.rebalances.size(), 1u);
  EXPECT_EQ(moved.rebalances[0].route,
            "through the scheduler: layers [2, 3) move from 0:0 to 0:2, "
            "which share no channel");
  EXPECT_EQ(moved.rebalances[0].sent_bytes, 0);
}

TEST(actors_replan, a_replan_that_changes_the_chips_is_refused) {
  auto job = replan_job();
  const plan start = cut(*job, {2, 2, 2});
  plan other = start;
  std::swap(other.replicas[0].stages[0].chip, other.replicas[0].stages[1].chip);
  try {
    run(job, start, {{2, other}});
    FAIL() << "a re-plan onto other chips was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("the re-plan before step 2"),
              std::string::npos)
      << e.what();
  }
}

} // namespace
} // namespace h2::test
