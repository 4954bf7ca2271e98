// What the end-to-end tests of h2-launch share: the binary, small job files,
// and readers of its output (progress lines, JSON log).
#pragma once

#include "child_process.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

namespace h2::test {

/// The h2-launch under test (CMake passes its path).
inline const std::string launch_binary = H2_LAUNCH;

/// The h2-node under test.
inline const std::string node_binary = H2_NODE;

/// Kill-timeout of a run that should take a second or two: generous, so a
/// loaded machine never trips it, but a hang fails the test.
inline constexpr std::chrono::seconds run_timeout{120};

/// A small job on four emulated chips of four kinds in two nodes (0:0
/// h100-sxm, 0:1 mi250x, 1:0 a100-sxm-40gb, 1:1 v100-sxm2-32gb in fp32),
/// three manual stages on 0:0, 0:1, 1:0 holding layers [0, 2), [2, 5),
/// [5, 6) of a 6-layer model (embedding + 4 blocks + head), 4 micro-batches
/// of 2 sequences, 20 steps, validation every 5 steps, virtual clock.
inline const std::string small_job = R"(# h2-launch end-to-end tests
[job]
name = "e2e"
seed = 7

[model]
vocab_size = 17
seq_len = 16
d_model = 32
n_head = 2
n_layer = 4

[data]
source = "markov"
entropy_rate = 1.0

[train]
steps = 20
global_batch = 8
micro_batch = 2
lr = 1e-3
eval_every = 5

[emulation]
clock = "virtual"
memory_scale = 1e-3

[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x"]

[[nodes]]
chips = ["emulated:a100-sxm-40gb", {device = "emulated:v100-sxm2-32gb", dtype = "fp32"}]

[plan]
mode = "manual"
schedule = "1f1b"
stages = ["0:0", "0:1", "1:0"]
layers = [2, 3, 1]
)";

/// Data parallelism over two heterogeneous pipelines of small_job, one per
/// node: 0:0 + 0:1 with 2 micro-batches of 2, 1:0 + 1:1 with 4 of 1.
inline const std::string two_replica_plan = R"({
  "format": "h2-plan", "version": 1, "schedule": "1f1b",
  "replicas": [
    {"micro_batch_size": 2, "micro_batches": 2,
     "stages": [{"chip": "0:0", "layers": [0, 4]},
                {"chip": "0:1", "layers": [4, 6]}]},
    {"micro_batch_size": 1, "micro_batches": 4,
     "stages": [{"chip": "1:0", "layers": [0, 1]},
                {"chip": "1:1", "layers": [1, 6]}]}
  ]
}
)";

/// `text` with its one occurrence of `from` replaced by `to`; a test
/// failure when `from` does not occur exactly once (the base job changed).
inline std::string replaced(const std::string& text, const std::string& from,
                            const std::string& to) {
  auto at = text.find(from);
  if (at == std::string::npos || text.find(from, at + 1) != std::string::npos) {
    ADD_FAILURE() << "the job text should contain '" << from
                  << "' exactly once";
    return text;
  }
  return text.substr(0, at) + to + text.substr(at + from.size());
}

/// Lines of `out` that are progress lines ("step     3/20 | loss ...").
inline std::vector<std::string> step_lines(const std::string& out) {
  std::vector<std::string> steps;
  for (auto& line : lines_of(out))
    if (line.rfind("step ", 0) == 0)
      steps.push_back(line);
  return steps;
}

/// The JSON objects of a JSON log, one per line. A line that does not
/// parse is a test failure (and is skipped).
inline std::vector<nlohmann::json> json_log(const std::string& text) {
  std::vector<nlohmann::json> out;
  int n = 0;
  for (auto& line : lines_of(text)) {
    ++n;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception& e) {
      ADD_FAILURE() << "JSON log line " << n << " is not JSON (" << e.what()
                    << "): " << line;
    }
  }
  return out;
}

/// The objects of `log` whose "event" is `event`.
inline std::vector<nlohmann::json>
events(const std::vector<nlohmann::json>& log, const std::string& event) {
  std::vector<nlohmann::json> out;
  for (auto& j : log)
    if (j.is_object() && j.value("event", "") == event)
      out.push_back(j);
  return out;
}

/// Number of complete step objects in a JSON log being written (complete
/// lines only: the last line may still be in flight).
/// The per-step training losses of a JSON log file, in order.
inline std::vector<double> logged_losses(const std::filesystem::path& log) {
  std::vector<double> out;
  for (const auto& j : events(json_log(read_text(log)), "step"))
    out.push_back(j.at("loss").get<double>());
  return out;
}

inline int logged_steps(const std::string& text) {
  int n = 0;
  std::size_t start = 0;
  for (auto end = text.find('\n'); end != std::string::npos;
       start = end + 1, end = text.find('\n', start))
    if (text.substr(start, end - start).find("\"event\":\"step\"") !=
        std::string::npos)
      ++n;
  return n;
}

/// What a crash, an uncaught exception (libtorch's, the C++ runtime's,
/// CAF's) or a broken invariant (H2_ENFORCE) prints, and a one-line error
/// for a user never contains.
inline const std::vector<std::string> stack_trace_markers = {
  "Exception raised from", "frame #", "terminate called", "unhandled exception",
  "internal error"};

/// Adds a failure for each way `err` is not the one-line error a user
/// expects: empty, more than one line, no trailing newline, a stack trace.
inline void expect_one_line(const std::string& err) {
  ASSERT_FALSE(err.empty()) << "stderr is empty";
  EXPECT_EQ(err.back(), '\n') << "stderr should end with a newline: " << err;
  std::string trimmed = err.substr(0, err.find_last_not_of('\n') + 1);
  EXPECT_EQ(trimmed.find('\n'), std::string::npos)
    << "stderr should be exactly one line, got:\n"
    << err;
  for (const auto& marker : stack_trace_markers)
    EXPECT_EQ(err.find(marker), std::string::npos)
      << "stderr contains '" << marker << "':\n"
      << err;
}

/// Waits for an h2-node of rank 0 to print "coordinator at HOST:PORT";
/// returns HOST:PORT ("" when rank 0 ended or the wait ran out first).
inline std::string coordinator_of(child_process& rank0) {
  static const std::regex re(R"(coordinator at (\S+:\d+))");
  std::string found;
  rank0.wait_until(
    [&] {
      std::smatch m;
      std::string out = rank0.out();
      if (!std::regex_search(out, m, re))
        return false;
      found = m[1];
      return true;
    },
    run_timeout);
  return found;
}

/// Runs h2-node rank 1 of a two-node small_job (`job`, `secret`) against
/// `coordinator` to its end in `dir`, and checks that it and `rank0` exit 0
/// with rank 0 printing every one of the 20 steps.
inline void expect_rank1_trains_to_the_end(child_process& rank0,
                                           const std::filesystem::path& job,
                                           const std::filesystem::path& secret,
                                           const std::string& coordinator,
                                           const scratch_dir& dir) {
  auto r = run_to_end(node_binary,
                      {"--job", job.string(), "--node-rank", "1",
                       "--world-size", "2", "--coordinator", coordinator,
                       "--secret-file", secret.string(), "--no-metrics"},
                      dir, run_timeout);
  EXPECT_EQ(r.status.code, 0) << r.status.describe() << r.err;
  auto end = rank0.wait(run_timeout);
  EXPECT_EQ(end.code, 0) << end.describe() << rank0.err();
  EXPECT_EQ(step_lines(rank0.out()).size(), 20u);
}

} // namespace h2::test
