// What h2-plan --compare and the benchmarks set HeteroAuto's plan against:
// the even plan of the same chips, and every chip kind alone (the
// homogeneous sub-clusters), whose summed throughput defines the
// super-linear ratio of the H2 paper (docs/planner.md, "The super-linear
// ratio", states the definition and why its batch rule is fair).
#pragma once

#include "h2/scheduler/planner.hpp"

#include <optional>
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
  /// HeteroAuto baselines: the plan's shape ("4 x [h100-sxm x64]") and what
  /// binds it (binding_constraints()).
  std::string shape;
  std::string binding;
  /// Not feasible: the one change the planner found that lets these chips
  /// train the model (its suggested_change), or that it found none.
  std::string lever;
};

struct comparison {
  /// plan.mode = "even" over the planned chips (micro-batches of
  /// train.micro_batch).
  baseline even;
  /// Each chip kind (profile and dtype) alone, planned by HeteroAuto with
  /// the same options and its share of the global batch (global_batch x
  /// its chips / all chips, rounded, at least 1): the cluster split into
  /// homogeneous islands, each chip training as many sequences per step as
  /// in the mixed plan.
  std::vector<baseline> homogeneous;
  double homogeneous_tokens_per_second = 0; ///< their sum
  /// The H2 paper's ratio: the plan's tokens_per_second /
  /// homogeneous_tokens_per_second, a kind that cannot train alone counting
  /// 0; 0 when no sub-cluster fits.
  double super_linear_ratio = 0;
  /// The same comparison without the kinds that cannot train alone (which
  /// flatter the ratio above): HeteroAuto's plan of the other kinds' chips
  /// together with the sum of their batch shares, over the sum of those
  /// kinds alone. Equal to super_linear_ratio (and `trainable` unset) when
  /// every kind can train alone; 0 when none can.
  std::optional<baseline> trainable;
  double trainable_ratio = 0;
};

/// What binds a plan, in one line: the largest of its losses against
/// perfect efficiency, then the others: the bubble (idle share of the
/// pipeline phase), memory (the compute recomputation adds, the memory
/// headroom, the micro-batch size memory allows), the all-reduce (its
/// longest, as a share of the step), micro-batch efficiency (a block's time
/// per sequence at replica 0's micro-batch size over one micro-batch of all
/// its sequences, on its first chip).
std::string binding_constraints(planner& pl, const plan_report& report);

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
