// The flags of every binary that trains (h2-launch, h2-node), as one table:
// how each is added to a command line, and how h2-launch --nodes hands it on
// to the h2-node processes it starts (docs/cli.md, "Several processes").
// One table, so that a flag h2-launch takes reaches its nodes as it was
// given.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

namespace h2::apps {

/// Flags of every binary that trains.
struct run_flags {
  int steps = 0; ///< 0: train.steps
  std::string json_log;
  std::string trace;
  std::string plan_path;
  std::string export_path;
  int metrics_port = -1; ///< -1: metrics.port of the job
  int admin_port = -1;   ///< -1: admin.port of the job
  bool no_metrics = false;
  bool quiet = false;
  int stop_after = 0; ///< end cleanly after this step (0: train.steps)
  std::string resume; ///< checkpoint directory, "latest" or "" (none)
  /// --init-from: a Hugging Face model directory to start from ("" none).
  std::string init_from;
  /// --replan STEP:PLAN.json, as given (a drill: move layers live).
  std::vector<std::string> replans;
  /// --join-timeout: overrides cluster.join_timeout_seconds (jobs over
  /// several h2-node processes).
  std::optional<double> join_timeout_seconds;
};

/// Which h2-node processes of h2-launch --nodes get a flag.
enum class flag_reach {
  every_node,       ///< as given
  coordinator_node, ///< only the lowest rank (logs, plan, checkpoints, admin)
  per_node,         ///< h2-launch works out each node's own (metrics ports)
};

struct run_flag {
  const char* name; ///< "--json-log"
  flag_reach reach;
  /// Adds the flag to a command line, bound to its member of run_flags.
  void (*add)(CLI::App& cli, run_flags& f);
  /// Appends the flag as given ("--json-log", "FILE"), nothing when unset.
  void (*argv)(const run_flags& f, std::vector<std::string>& out);
};

/// Every run flag: --steps, --json-log, --trace, --plan, --export,
/// --metrics-port, --no-metrics, --admin-port, --quiet, --stop-after,
/// --resume, --init-from, --replan, --join-timeout.
const std::vector<run_flag>& run_flag_table();

/// Adds every run flag to `cli`.
void add_run_flags(CLI::App& cli, run_flags& flags);

/// The run flags a node started by h2-launch --nodes gets (all but the
/// per_node ones; the coordinator_node ones only when `coordinator_node`).
std::vector<std::string> run_flags_argv(const run_flags& flags,
                                        bool coordinator_node);

} // namespace h2::apps
