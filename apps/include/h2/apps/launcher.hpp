// h2-launch --nodes N: runs a job as N local h2-node processes, relays their
// output as one stream, forwards SIGINT/SIGTERM, and writes a Prometheus
// file_sd targets file listing every node's /metrics.
#pragma once

#include "h2/apps/session.hpp"

#include <string>

namespace h2::apps {

struct launch_options {
  std::string job_path; ///< empty: the built-in demo
  int nodes = 1;
  run_flags flags;
  /// Where the file_sd targets file goes ("": not written).
  std::string targets_file = "h2-prometheus-targets.json";
  /// The h2-node binary.
  std::string node_binary;
};

/// Runs the job as `options.nodes` processes and returns the job's exit
/// code: rank 0's, or the first failing node's when rank 0 succeeded.
int launch_nodes(const launch_options& options);

/// The h2-node next to the running executable.
std::string sibling_binary(const std::string& name);

} // namespace h2::apps
