// How a run reports to whoever started it (progress lines, JSON logs,
// metrics, traces): callbacks on the scheduler actor's thread, between
// steps. Keep them short; they delay the next step.
#pragma once

#include "h2/runtime/reports.hpp"
#include "h2/runtime/step_summary.hpp"
#include "h2/core/plan.hpp"

#include <optional>
#include <vector>

namespace h2::runtime {

/// The end of a run.
struct run_summary {
  int steps = 0;              ///< steps completed
  bool stopped_early = false; ///< a stop request ended it before its last step
  double final_loss = 0;
  double final_val_loss = -1;   ///< < 0: no validation ran
  double mean_step_seconds = 0; ///< run clock, steps after the first
  double tokens_per_second = 0; ///< over the same steps
  double mean_bubble_fraction = 0;
  double virtual_seconds = 0; ///< virtual time of the whole run
  double wall_seconds = 0;    ///< wall time of the whole run
};

class training_observer {
public:
  virtual ~training_observer() = default;

  /// Every chip has built its stage.
  virtual void on_setup(const plan& p, const std::vector<setup_report>& chips) {
  }

  /// A step finished.
  virtual void on_step(const step_summary& s) {}

  /// A validation pass after step `step` (0-based) finished.
  virtual void on_eval(int step, double val_loss) {}

  /// The checkpoint of the state after `steps` completed steps is on disk
  /// (its manifest published). Training stood still for it
  /// `stall_seconds`: `waited_seconds` waiting for the previous save to
  /// finish, then the copy of the layers to host memory.
  virtual void on_checkpoint(int steps, double waited_seconds,
                             double stall_seconds) {}
};

/// Keeps every step summary and validation loss (tests, benchmarks, tools).
class step_recorder : public training_observer {
public:
  void on_step(const step_summary& s) override { steps.push_back(s); }
  void on_eval(int, double loss) override { val_losses.push_back(loss); }

  /// The training loss of every step so far.
  std::vector<double> losses() const {
    std::vector<double> out;
    for (const auto& s : steps)
      out.push_back(s.loss);
    return out;
  }

  std::vector<step_summary> steps;
  std::vector<double> val_losses;
};

} // namespace h2::runtime
