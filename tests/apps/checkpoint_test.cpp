// Checkpoints through h2-launch (docs/checkpoints.md): --stop-after K saves
// and ends cleanly, --resume latest continues to train.steps with the same
// losses as an uninterrupted run; a checkpoint of another model, or a
// damaged one, is a one-line error naming the key or the file, exit 2.
#include "launch.hpp"

#include <gtest/gtest.h>

#include <fstream>

namespace h2::test {
namespace {

class apps_checkpoint : public ::testing::Test {
protected:
  /// small_job for 6 steps with [checkpoint] under the scratch directory.
  std::filesystem::path job(const std::string& name,
                            const std::string& edit_from = "",
                            const std::string& edit_to = "") {
    std::string text = replaced(small_job, "steps = 20", "steps = 6") +
                       "\n[checkpoint]\ndir = \"" +
                       (dir_ / "checkpoints").string() + "\"\n";
    if (!edit_from.empty())
      text = replaced(text, edit_from, edit_to);
    return dir_.write(name, text);
  }

  run_result launch(std::vector<std::string> args) {
    args.push_back("-q");
    return run_to_end(launch_binary, args, dir_, run_timeout);
  }

  /// A run to step 6 equals --stop-after 3, then --resume latest to 6, bit
  /// for bit in every loss; `nodes` adds --nodes 2 to the split runs (the
  /// whole run is in one process: the same math either way).
  void expect_resume_equals_one_run(std::vector<std::string> nodes) {
    auto whole_job =
      dir_.write("whole.toml", replaced(small_job, "steps = 20", "steps = 6"));
    auto r = launch(
      {whole_job.string(), "--json-log", (dir_ / "whole.jsonl").string()});
    ASSERT_TRUE(r.status.exited && r.status.code == 0) << r.err;

    auto j = job("job.toml");
    std::vector<std::string> first = {j.string(), "--stop-after", "3",
                                      "--json-log",
                                      (dir_ / "first.jsonl").string()};
    first.insert(first.end(), nodes.begin(), nodes.end());
    r = launch(first);
    ASSERT_TRUE(r.status.exited && r.status.code == 0) << r.err;
    EXPECT_TRUE(std::filesystem::exists(
      dir_ / "checkpoints" / "step-00000003" / "manifest.json"));
    std::vector<std::string> second = {j.string(), "--resume", "latest",
                                       "--json-log",
                                       (dir_ / "second.jsonl").string()};
    second.insert(second.end(), nodes.begin(), nodes.end());
    r = launch(second);
    ASSERT_TRUE(r.status.exited && r.status.code == 0) << r.err;
    EXPECT_NE(r.out.find("h2: resuming from"), std::string::npos) << r.out;

    auto split = logged_losses(dir_ / "first.jsonl");
    auto rest = logged_losses(dir_ / "second.jsonl");
    split.insert(split.end(), rest.begin(), rest.end());
    EXPECT_EQ(split, logged_losses(dir_ / "whole.jsonl")); // bitwise
  }

  scratch_dir dir_;
};

TEST_F(apps_checkpoint, stop_after_then_resume_latest_equals_one_run) {
  expect_resume_equals_one_run({});
}

TEST_F(apps_checkpoint, the_same_holds_over_two_nodes) {
  expect_resume_equals_one_run({"--nodes", "2"});
  // Each node wrote its own layers; rank 0 the manifest and the marker.
  EXPECT_TRUE(std::filesystem::exists(dir_ / "checkpoints" / "h2-job-marker"));
}

TEST_F(apps_checkpoint, a_checkpoint_of_another_model_is_refused) {
  auto j = job("job.toml");
  auto r = launch({j.string(), "--stop-after", "2"});
  ASSERT_TRUE(r.status.exited && r.status.code == 0) << r.err;
  auto other = job("other.toml", "d_model = 32", "d_model = 64");
  r = launch({other.string(), "--resume", "latest"});
  EXPECT_TRUE(r.status.exited && r.status.code == 2) << r.status.describe();
  expect_one_line(r.err);
  EXPECT_NE(r.err.find("model.d_model"), std::string::npos) << r.err;
  EXPECT_TRUE(step_lines(r.out).empty()) << r.out;
}

TEST_F(apps_checkpoint, a_damaged_checkpoint_is_named) {
  auto j = job("job.toml");
  auto r = launch({j.string(), "--stop-after", "2"});
  ASSERT_TRUE(r.status.exited && r.status.code == 0) << r.err;
  const auto layer =
    dir_ / "checkpoints" / "step-00000002" / "layer-00003.safetensors";
  ASSERT_TRUE(std::filesystem::exists(layer));
  {
    std::fstream f(layer, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    const char byte = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(-5, std::ios::end);
    f.put(byte); // a changed byte in the data: its CRC no longer matches
  }
  r = launch({j.string(), "--resume",
              (dir_ / "checkpoints" / "step-00000002").string()});
  EXPECT_TRUE(r.status.exited && r.status.code == 2) << r.status.describe();
  expect_one_line(r.err);
  EXPECT_NE(r.err.find("layer-00003.safetensors"), std::string::npos) << r.err;
  EXPECT_TRUE(step_lines(r.out).empty()) << r.out;
}

} // namespace
} // namespace h2::test
