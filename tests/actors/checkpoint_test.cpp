// Checkpoints of a job in one process (docs/checkpoints.md): a run to step
// N equals a run stopped at step K, saved, and resumed to N, bit for bit in
// every loss, every parameter and every AdamW moment, also when the resumed
// run has another plan (other stage boundaries, another number of chips).
#include "h2/actors/local_job.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

namespace h2::test {
namespace {

namespace fs = std::filesystem;

class actors_checkpoint : public ::testing::Test {
protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("h2-checkpoint-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  /// Four fp32 chips of three kinds, 4 steps, checkpoints under `dir`.
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

  fs::path root_;
};

void expect_same_parameters(const std::vector<runtime::parameter_values>& a,
                            const std::vector<runtime::parameter_values>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(a[i].values == b[i].values) << a[i].name;
  }
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

TEST_F(actors_checkpoint, resume_on_another_plan_equals_one_run) {
  auto whole_job = job("whole");
  const auto whole = run(whole_job, scheduler::make_plan(*whole_job), 4);

  // Saved under two stages [3, 3], resumed on three chips [1, 2, 3].
  auto split_job = job("split");
  run(split_job, scheduler::make_plan(*split_job), 2);
  plan three = scheduler::make_plan(*split_job);
  auto& stages = three.replicas[0].stages;
  stages = {{chip_id{0, 2}, 0, 1, false},
            {chip_id{0, 3}, 1, 3, false},
            {chip_id{0, 0}, 3, 6, false}};
  validate_plan(three, *split_job, "three-stage plan");
  const auto second = run(split_job, three, 4, latest("split"));
  EXPECT_EQ(second.losses,
            std::vector<double>(whole.losses.begin() + 2, whole.losses.end()));
  expect_same_parameters(second.params, whole.params);
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
