// What h2-plan --compare and the benchmarks set HeteroAuto's plan against:
// the even plan of the same chips, and every chip kind alone (the
// homogeneous sub-clusters), whose summed throughput defines the
// super-linear ratio of the H2 paper.
#pragma once

#include "h2/scheduler/planner.hpp"

#include <string>
#include <vector>

namespace h2::scheduler {

/// One baseline's prediction.
struct baseline {
  std::string name; ///< "even (4 stages, micro-batch 4)", "h100-sxm/bf16"
  int chips = 0;
  int global_batch = 0; ///< sequences per step
  bool feasible = false;
  std::string why_not; ///< when not feasible
  double step_seconds = 0;
  double tokens_per_second = 0;
  /// The plan predicted (when feasible): the even plan, or a sub-cluster's
  /// HeteroAuto plan for the job with global_batch sequences per step.
  plan value;
};

struct comparison {
  /// plan.mode = "even" over the planned chips (micro-batches of
  /// train.micro_batch).
  baseline even;
  /// Each chip kind (profile and dtype) alone, planned by HeteroAuto with
  /// its share of the global batch (global_batch x its chips / all chips,
  /// at least 1): the cluster split into homogeneous islands, each
  /// training its part of the tokens.
  std::vector<baseline> homogeneous;
  double homogeneous_tokens_per_second = 0; ///< their sum
  /// tokens_per_second / homogeneous_tokens_per_second; 0 when no
  /// sub-cluster fits.
  double super_linear_ratio = 0;
};

/// The baselines of `best` (HeteroAuto's report for `job` with `options`).
comparison compare_with_baselines(const job_config& job,
                                  chip_measurements& measurements,
                                  const planner_options& options,
                                  const plan_report& best);

/// `full` cut to every `stride`-th node (nodes 0, stride, 2 stride, ...,
/// renumbered from 0), those chips in plan.stages (the chips an auto job
/// plans for), the global batch divided by `stride` (at least 1): a smaller
/// cluster of the same mix when the kinds occupy ranges of nodes (the
/// planning-time benchmark's 64 and 256 chips out of 1,024).
job_config sub_cluster(const job_config& full, int stride);

} // namespace h2::scheduler
