// What a step was, from every chip's reports: loss, step time, bubble, per-
// chip busy/idle/memory. Pure arithmetic (no actors, no torch), shared by the
// scheduler actor, progress output, JSON logs, metrics and traces.
#pragma once

#include "h2/runtime/reports.hpp"
#include "h2/core/job.hpp"

#include <vector>

namespace h2::runtime {

/// One chip's share of a step, in the run's clock.
struct chip_step_stats {
  chip_id chip;
  int replica = 0;
  int stage = 0;
  double forward_seconds = 0;
  double backward_seconds = 0;
  double optimizer_seconds = 0;
  /// Time of the forward/backward phase this chip was not computing
  /// (waiting for neighbours: its share of the pipeline bubble).
  double idle_seconds = 0;
  memory_report memory;
  std::vector<channel_traffic> traffic; ///< this step, per neighbour
  std::uint64_t overruns = 0;           ///< cumulative, wall clock only
  double overrun_seconds = 0;
};

/// An op of the step on one chip, for traces.
struct traced_op {
  chip_id chip;
  op_record op;
};

struct step_summary {
  int step = 0;    ///< 0-based
  double loss = 0; ///< mean token loss of the global batch
  double lr = 0;
  double grad_norm = 0; ///< before clipping
  double clip_coefficient = 1;
  double step_seconds = 0; ///< in the run's clock
  double virtual_step_seconds = 0;
  double wall_step_seconds = 0;
  /// Length of the forward/backward phase (run clock).
  double pipeline_seconds = 0;
  /// Idle share of the forward/backward phase over all chips: the bubble.
  double bubble_fraction = 0;
  double tokens_per_second = 0;
  /// Virtual time the step ended (the next step's barrier).
  double virtual_end = 0;
  /// Wall time (seconds since the run's origin) the step began and ended on
  /// its first and last chip: gaps between steps show as wall_start of one
  /// minus wall_end of the previous.
  double wall_start = 0;
  double wall_end = 0;
  std::vector<chip_step_stats> chips; ///< in chip-id order
  std::vector<traced_op> ops;
};

/// Combines the chips' reports of one step. `steps` and `updates` hold one
/// entry per chip (any order).
step_summary summarize_step(int step, clock_mode clock, std::int64_t tokens,
                            double lr, double grad_norm,
                            double clip_coefficient,
                            const std::vector<chip_step_report>& steps,
                            const std::vector<chip_update_report>& updates);

/// The global gradient norm from every stage's per-layer squared norms,
/// summed in global layer order, so every partition gets the same bits.
/// Replicas hold the same gradients after their all-reduce: replica 0's
/// stages are used.
double grad_norm_of(const std::vector<chip_step_report>& steps);

/// The virtual time at which every chip has finished its backward phase:
/// the global gradient-norm reduction's barrier.
double virtual_phase_end(const std::vector<chip_step_report>& steps);

} // namespace h2::runtime
