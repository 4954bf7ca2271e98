// What the scheduler decides between the phases of a step, without the
// actor: the update from the chips' gradient norms (learning rate, global
// norm, clip coefficient), when validation is due, and the run's totals.
// Pure arithmetic; the scheduler actor (actors/scheduler_actor.cpp) only
// routes the reports here and the commands back.
#pragma once

#include "h2/core/job.hpp"
#include "h2/runtime/observer.hpp"
#include "h2/runtime/reports.hpp"
#include "h2/runtime/step_summary.hpp"

#include <vector>

namespace h2::runtime {

/// The optimizer phase of step `step` (0-based), from its chips' reports.
struct update_decision {
  double grad_norm = 0; ///< global, before clipping
  update_command command;
};

/// The global gradient norm (grad_norm_of), the clip coefficient and the
/// learning rate of `step`, and the virtual barrier every chip waits for.
/// Throws h2::error when the norm is not finite: applying it would turn
/// every weight into NaN, so the run stops, as Megatron-LM's does.
update_decision decide_update(const job_config& job, int step,
                              const std::vector<chip_step_report>& steps);

/// Whether validation runs after `completed` steps of a run of `steps`.
bool eval_due(const job_config& job, int completed, int steps);

/// The totals of a run, step by step. The first step pays for warm-up
/// (allocations, caches): it is left out of the averages when there are
/// others.
class run_totals {
public:
  /// `steps`: the run's length (for the warm-up rule).
  explicit run_totals(int steps) : steps_(steps) {}

  /// A finished step (its summary, its updates for the wall end).
  void add(const step_summary& s,
           const std::vector<chip_update_report>& updates,
           std::int64_t tokens_per_step);

  /// A finished validation pass.
  void add_eval(double val_loss) { summary_.final_val_loss = val_loss; }

  /// The run so far.
  run_summary summary(bool stopped_early) const;

private:
  int steps_;
  run_summary summary_;
  double timed_seconds_ = 0; ///< steps after the first (run clock)
  double timed_tokens_ = 0;
  double bubble_sum_ = 0;
};

} // namespace h2::runtime
