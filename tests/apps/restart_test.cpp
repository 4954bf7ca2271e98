// Failures around checkpoints with real processes (docs/checkpoints.md): a
// node killed at each point inside a save leaves the previous checkpoint
// the latest and loadable, and the job resumed from it ends as an
// uninterrupted run does; a node SIGKILLed in a 3-node job with
// [restart] max = 1 is planned around, the job resumes from its last
// checkpoint on the chips that are left and reaches its final step.
#include "h2/core/files.hpp"
#include "launch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <regex>

namespace h2::test {
namespace {

using namespace std::chrono_literals;

/// Crash points of a save (runtime::crash_point), in the order a save
/// passes them: with its layer files written, with its manifest in the
/// partial directory, and once renamed into place (published). The runtime
/// tests pass every point in one process.
const std::vector<std::string> crash_points = {
  "after-layer-file", "after-manifest-rename", "after-publish"};

class apps_save_crash : public ::testing::TestWithParam<std::string> {
protected:
  /// small_job for 6 steps, a checkpoint every 2 steps.
  std::filesystem::path job() {
    return dir_.write("job.toml",
                      replaced(small_job, "steps = 20", "steps = 6") +
                        "\n[checkpoint]\ndir = \"" +
                        (dir_ / "checkpoints").string() +
                        "\"\nevery = 2\n");
  }

  run_result launch(std::vector<std::string> args) {
    args.insert(args.end(), {"-q", "--no-metrics"});
    return run_to_end(launch_binary, args, dir_, run_timeout);
  }

  /// Saves step 2, then kills the run (every node: the variable reaches
  /// all of them) at GetParam() inside the save of step 4; checks what
  /// `latest` is then and that the job resumed from it ends as one run.
  void crash_and_resume(const std::vector<std::string>& nodes) {
    auto j = job();
    auto whole = launch({j.string(), "--json-log",
                         (dir_ / "whole.jsonl").string(), "--stop-after", "6"});
    ASSERT_TRUE(whole.status.exited && whole.status.code == 0) << whole.err;
    h2::remove_tree(dir_ / "checkpoints");

    std::vector<std::string> first = {j.string(), "--stop-after", "2"};
    first.insert(first.end(), nodes.begin(), nodes.end());
    auto r = launch(first);
    ASSERT_TRUE(r.status.exited && r.status.code == 0) << r.err;
    {
      scoped_env crash("H2_TEST_CRASH_AT", GetParam());
      std::vector<std::string> second = {j.string(), "--resume", "latest"};
      second.insert(second.end(), nodes.begin(), nodes.end());
      r = launch(second);
    }
    ASSERT_FALSE(r.status.exited && r.status.code == 0)
      << "the crash point " << GetParam() << " was never reached";

    // Published (after the directory's rename): step 4 is the latest;
    // before: step 2, and it loads (the run resumed from it checks every
    // byte).
    const int expected = GetParam() == "after-publish" ? 4 : 2;
    std::vector<std::string> third = {j.string(), "--resume", "latest",
                                      "--json-log",
                                      (dir_ / "rest.jsonl").string()};
    third.insert(third.end(), nodes.begin(), nodes.end());
    r = launch(third);
    ASSERT_TRUE(r.status.exited && r.status.code == 0) << r.err;
    EXPECT_NE(r.out.find("h2: resuming from " +
                         (dir_ / "checkpoints" /
                          ("step-0000000" + std::to_string(expected)))
                           .string()),
              std::string::npos)
      << r.out;
    auto all = logged_losses(dir_ / "whole.jsonl");
    ASSERT_EQ(all.size(), 6u);
    EXPECT_EQ(logged_losses(dir_ / "rest.jsonl"),
              std::vector<double>(all.begin() + expected, all.end()));
  }

  scratch_dir dir_;
};

TEST_P(apps_save_crash, in_one_process_leaves_the_previous_checkpoint) {
  crash_and_resume({});
}

TEST_P(apps_save_crash, over_two_nodes_leaves_the_previous_checkpoint) {
  crash_and_resume({"--nodes", "2"});
}

INSTANTIATE_TEST_SUITE_P(points, apps_save_crash,
                         ::testing::ValuesIn(crash_points),
                         [](const auto& info) {
                           auto name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(apps_restart, a_killed_node_is_planned_around_and_the_job_finishes) {
  scratch_dir dir;
  // Three nodes; the plan uses chips of nodes 0 and 1, node 2 waits. 800
  // steps: the kill comes after 120, and the restarted job's 700 more fit
  // run_timeout under ASan on a slow host (1,400 did not, at about 10
  // steps a second).
  auto job = dir.write(
    "job.toml", replaced(small_job, "steps = 20", "steps = 800") + R"(
[[nodes]]
chips = ["emulated:mi300x"]

[checkpoint]
dir = ")" + (dir / "checkpoints").string() +
                  R"("
every = 50

[restart]
max = 1
)");
  child_process launch(launch_binary,
                       {job.string(), "--nodes", "3", "-q", "--metrics-port",
                        "0", "--metrics-targets",
                        (dir / "targets.json").string(), "--json-log",
                        (dir / "log.jsonl").string()},
                       dir / "stdout.txt", dir / "stderr.txt");
  ASSERT_TRUE(launch.wait_until(
    [&] { return logged_steps(read_text(dir / "log.jsonl")) >= 120; },
    run_timeout))
    << launch.err();
  const pid_t victim = node_pid(launch.pid(), 1);
  ASSERT_GT(victim, 0);
  ::kill(victim, SIGKILL);

  // The restarted coordinator (node 0: its lines have no "[node N]"
  // prefix) serves h2_restarts_total 1.
  static const std::regex metrics_at(
    R"(^h2-node: metrics at http://[^:]+:(\d+)/metrics)");
  std::string scraped;
  launch.wait_until(
    [&] {
      std::vector<int> ports;
      for (const auto& line : lines_of(launch.out()))
        if (std::smatch m; std::regex_search(line, m, metrics_at))
          ports.push_back(std::stoi(m[1]));
      if (ports.size() < 2) // before the failure, then after the restart
        return false;
      try {
        scraped = http_get(ports[1], "/metrics");
      } catch (const std::exception&) {
        return false;
      }
      return true;
    },
    run_timeout);
  auto status = launch.wait(run_timeout);
  ASSERT_TRUE(status.exited && status.code == 0)
    << status.describe() << "\n" << launch.err();

  const std::string err = launch.err();
  EXPECT_NE(err.find("h2-launch: restart 1 of 1 after node 1 was killed by "
                     "signal 9: re-planning on nodes 0, 2, resuming from"),
            std::string::npos)
    << err;
  EXPECT_NE(scraped.find("h2_restarts_total 1"), std::string::npos) << scraped;
  // The log goes on after a restart event, from the checkpoint's step to
  // the last one.
  auto log = json_log(read_text(dir / "log.jsonl"));
  ASSERT_EQ(events(log, "restart").size(), 1u);
  auto steps = events(log, "step");
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back().at("step").get<int>(), 799);
  EXPECT_NE(launch.out().find("h2: done after 800 steps"), std::string::npos)
    << launch.out();
}

} // namespace
} // namespace h2::test
