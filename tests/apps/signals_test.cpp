// SIGINT/SIGTERM: the first stops at the next step boundary (exit 128 +
// signal, the JSON log complete), the second aborts the step in flight. A
// launcher killed by SIGKILL takes its nodes and its secret with it.
#include "launch.hpp"

#include "h2/apps/signals.hpp"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace h2::test {
namespace {

using namespace std::chrono_literals;

/// small_job on the wall clock, every chip `time_scale` times slower (the
/// emulated step takes 0.75 ms, so a step takes about time_scale x 0.75 ms
/// of real time while the CPU mostly sleeps).
std::string slow_job(int time_scale) {
  return replaced(small_job, "clock = \"virtual\"",
                  "clock = \"wall\"\ntime_scale = " +
                    std::to_string(time_scale));
}

/// What must hold once h2-launch has been reaped: no process is left in its
/// process group (threads die with it, but a forked helper would not) and
/// it left no shared-memory files behind.
void expect_nothing_lingers(pid_t pid,
                            const std::vector<std::string>& shm_before) {
  errno = 0;
  EXPECT_EQ(::kill(pid, 0), -1) << "pid " << pid << " still exists";
  EXPECT_EQ(errno, ESRCH);
  errno = 0;
  EXPECT_EQ(::kill(-pid, 0), -1)
    << "a process of h2-launch's group " << pid << " still runs";
  EXPECT_EQ(errno, ESRCH);
  for (const auto& name : shm_entries("h2"))
    EXPECT_NE(std::find(shm_before.begin(), shm_before.end(), name),
              shm_before.end())
      << "left behind: /dev/shm/" << name;
}

class apps_signals : public ::testing::TestWithParam<int> {
protected:
  scratch_dir dir_;
};

TEST_P(apps_signals, first_signal_stops_at_a_step_boundary) {
  const int sig = GetParam();
  const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  auto job = dir_.write("job.toml", slow_job(400));
  auto log = dir_ / "log.jsonl";
  auto shm_before = shm_entries("h2");
  child_process child(
    launch_binary,
    {job.string(), "--steps", "100000", "--json-log", log.string()},
    dir_ / "stdout.txt", dir_ / "stderr.txt");
  const int n = 3;
  ASSERT_TRUE(child.wait_until(
    [&] { return logged_steps(read_text(log)) >= n; }, run_timeout))
    << "fewer than " << n << " steps logged; " << child.wait(1s).describe()
    << "\nstderr:\n"
    << child.err();
  const int logged = logged_steps(read_text(log));
  child.send(sig);
  auto status = child.wait(run_timeout);
  ASSERT_FALSE(status.timed_out) << "did not stop; stderr:\n" << child.err();
  EXPECT_TRUE(status.exited && status.code == 128 + sig)
    << "expected exit code " << 128 + sig << ", got " << status.describe()
    << "\nstderr:\n"
    << child.err();
  expect_nothing_lingers(child.pid(), shm_before);

  // The log is complete: every line a JSON object, the summary last.
  std::string text = read_text(log);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "the log ends inside a line";
  auto entries = json_log(text);
  ASSERT_FALSE(entries.empty());
  const auto& summary = entries.back();
  ASSERT_EQ(summary.value("event", ""), "summary") << summary.dump();
  EXPECT_EQ(summary.value("stopped_early", false), true);
  const int steps = summary.value("steps", -1);
  EXPECT_GE(steps, logged);
  EXPECT_LE(steps, logged + 2) << "it should stop at the next step boundary";
  EXPECT_EQ(static_cast<int>(events(entries, "step").size()), steps);
  EXPECT_EQ(static_cast<int>(step_lines(child.out()).size()), steps);
  EXPECT_NE(
    child.out().find("h2: stopped after " + std::to_string(steps) + " steps"),
    std::string::npos)
    << child.out();

  std::string err = child.err();
  EXPECT_NE(err.find(name + ": stopping at the next step boundary"),
            std::string::npos)
    << err;
  for (const auto& marker : stack_trace_markers)
    EXPECT_EQ(err.find(marker), std::string::npos) << err;
  EXPECT_EQ(err.find("error"), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(sigint_and_sigterm, apps_signals,
                         ::testing::Values(SIGINT, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGINT ? "SIGINT"
                                                                   : "SIGTERM");
                         });

class apps_signals_abort : public ::testing::Test {
protected:
  scratch_dir dir_;
};

TEST_F(apps_signals_abort, second_sigterm_aborts_the_step_in_flight) {
  // A step takes about 15 s of real time: the signals land in the first.
  auto job = dir_.write("job.toml", slow_job(20000));
  auto log = dir_ / "log.jsonl";
  auto shm_before = shm_entries("h2");
  child_process child(
    launch_binary, {job.string(), "--steps", "3", "--json-log", log.string()},
    dir_ / "stdout.txt", dir_ / "stderr.txt");
  ASSERT_TRUE(child.wait_until(
    [&] { return child.out().find("h2:   stage 2") != std::string::npos; },
    run_timeout))
    << "no setup report; " << child.wait(1s).describe() << "\nstderr:\n"
    << child.err();
  child.send(SIGTERM);
  // Two signals sent at once merge into one pending signal: wait until
  // h2-launch took the first.
  ASSERT_TRUE(child.wait_until(
    [&] {
      return child.err().find("stopping at the next step boundary") !=
             std::string::npos;
    },
    run_timeout))
    << "the first SIGTERM was not announced; stderr:\n"
    << child.err();
  child.send(SIGTERM);
  auto status = child.wait(run_timeout);
  ASSERT_FALSE(status.timed_out) << "did not abort; stderr:\n" << child.err();
  EXPECT_TRUE(status.exited && status.code == 128 + SIGTERM)
    << "expected exit code " << 128 + SIGTERM << ", got " << status.describe()
    << "\nstderr:\n"
    << child.err();
  expect_nothing_lingers(child.pid(), shm_before);

  std::string err = child.err();
  EXPECT_NE(err.find("SIGTERM again: aborting"), std::string::npos) << err;
  EXPECT_NE(err.find("h2-launch: aborted by signal 15"), std::string::npos)
    << "the step in flight should end by the abort, not at its end:\n"
    << err;
  EXPECT_EQ(err.find("training failed"), std::string::npos) << err;
  for (const auto& marker : stack_trace_markers)
    EXPECT_EQ(err.find(marker), std::string::npos) << err;
  EXPECT_TRUE(step_lines(child.out()).empty()) << child.out();
  // What was logged is whole lines.
  std::string text = read_text(log);
  EXPECT_TRUE(text.empty() || text.back() == '\n') << text;
  json_log(text);
}

/// small_job over three nodes of one chip each, a stage each.
std::string three_node_job() {
  std::string job = replaced(
    small_job,
    "[[nodes]]\nchips = [\"emulated:h100-sxm\", \"emulated:mi250x\"]\n\n"
    "[[nodes]]\nchips = [\"emulated:a100-sxm-40gb\", {device = "
    "\"emulated:v100-sxm2-32gb\", dtype = \"fp32\"}]\n",
    "[[nodes]]\nchips = [\"emulated:h100-sxm\"]\n\n"
    "[[nodes]]\nchips = [\"emulated:mi250x\"]\n\n"
    "[[nodes]]\nchips = [\"emulated:a100-sxm-40gb\"]\n");
  return replaced(job, "stages = [\"0:0\", \"0:1\", \"1:0\"]",
                  "stages = [\"0:0\", \"1:0\", \"2:0\"]");
}

/// Whether `pid` runs (a zombie no longer does).
bool process_runs(pid_t pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() &&
         stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

/// The argument after `flag` in the command line of `pid` ("" if none).
std::string argument_of(pid_t pid, const std::string& flag) {
  const auto args =
    lines_of([&] {
      auto cmd = read_text("/proc/" + std::to_string(pid) + "/cmdline");
      std::replace(cmd.begin(), cmd.end(), '\0', '\n');
      return cmd;
    }());
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == flag)
      return args[i + 1];
  return "";
}

TEST(apps_launcher_death, sigkill_of_the_launcher_ends_its_nodes_and_secret) {
  // A probe found that with -q the nodes of a launcher killed by SIGKILL
  // trained on and its secret directory stayed (docs/cli.md, "Several
  // processes").
  scratch_dir dir;
  auto job = dir.write("job.toml", three_node_job());
  auto log = dir / "log.jsonl";
  child_process launcher(launch_binary,
                         {job.string(), "--nodes", "3", "--steps", "1000000",
                          "--no-metrics", "-q", "--json-log", log.string()},
                         dir / "stdout.txt", dir / "stderr.txt");
  ASSERT_TRUE(launcher.wait_until(
    [&] { return logged_steps(read_text(log)) >= 3; }, run_timeout))
    << launcher.err();
  std::vector<pid_t> nodes;
  for (int rank = 0; rank < 3; ++rank) {
    nodes.push_back(node_pid(launcher.pid(), rank));
    ASSERT_GT(nodes.back(), 0) << "no h2-node of rank " << rank;
  }
  const std::filesystem::path secret_dir =
    argument_of(nodes.front(), "--launcher-dir");
  ASSERT_EQ(secret_dir.parent_path(), "/tmp") << secret_dir;
  ASSERT_TRUE(std::filesystem::exists(secret_dir / "secret"));

  launcher.send(SIGKILL);
  const auto killed = launcher.wait(run_timeout);
  ASSERT_EQ(killed.signal, SIGKILL) << killed.describe();
  const auto start = std::chrono::steady_clock::now();
  // Bounded, not timed: by design the nodes end within 1.55 s
  // (launcher_watch); the figure is printed.
  auto any_runs = [&] {
    return std::any_of(nodes.begin(), nodes.end(), process_runs);
  };
  while (any_runs() && std::chrono::steady_clock::now() - start < 30s)
    std::this_thread::sleep_for(10ms);
  const double seconds = std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - start)
                           .count();
  for (std::size_t rank = 0; rank < nodes.size(); ++rank)
    if (process_runs(nodes[rank])) {
      ADD_FAILURE() << "h2-node " << rank << " still runs " << seconds
                    << " s after";
      // Its launcher is gone, and with it the group kill of child_process.
      ::kill(nodes[rank], SIGKILL);
    }
  std::printf("the nodes ended %.2f s after the launcher's SIGKILL\n",
              seconds);
  EXPECT_FALSE(std::filesystem::exists(secret_dir)) << secret_dir;
}

TEST(apps_signal_watcher, a_second_signal_aborts_only_while_the_scope_lives) {
  // In a child process: the test binary's other threads do not block the
  // stop signals, the child's only ones (main and the watcher) do.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    apps::block_stop_signals();
    std::atomic<int> calls{0};
    apps::signal_watcher watcher(nullptr, false);
    // Signals of one kind do not queue: each waits for the last to count.
    auto signal_and_wait = [&](int count) {
      ::kill(::getpid(), SIGTERM);
      for (int i = 0; i < 500 && watcher.stop_flag()->load() < count; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    };
    {
      const auto scope = watcher.aborting([&] { ++calls; });
      signal_and_wait(1); // stop
      signal_and_wait(2); // abort: calls the scope's
      for (int i = 0; i < 500 && calls.load() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // The scope is gone (the node it aborted is next): no more calls.
    signal_and_wait(3);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::_exit(watcher.stop_flag()->load() == 3 && calls.load() == 1
              ? 0
              : 10 + calls.load());
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status))
    << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10 + calls of the abort";
}

} // namespace
} // namespace h2::test
