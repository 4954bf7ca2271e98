// How a run reports to whoever started it (progress lines, JSON logs,
// metrics, traces): callbacks on the scheduler actor's thread, between
// steps. Keep them short; they delay the next step.
#pragma once

#include "h2/runtime/reports.hpp"
#include "h2/runtime/step_summary.hpp"
#include "h2/core/plan.hpp"

#include <optional>
#include <string>
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

/// A live rebalance carried out at a step boundary (docs/rebalance.md).
struct rebalance_event {
  int step = 0;       ///< the first step under the new plan
  int generation = 0; ///< plans adopted since the start (the first: 0)
  /// "throttled chip 0:1", "live metrics", "admin", "--replan", ...
  std::string reason;
  plan value; ///< the plan now running
  /// The layers that changed owner: "layers [3, 5) 0:1 -> 0:2".
  std::vector<std::string> moves;
  double moved_bytes = 0;
  /// How the layers went: "chip to chip" (each from its old owner straight
  /// to its new one over their channel), or "through the scheduler: "
  /// and why they could not go chip to chip (runtime::migration).
  std::string route;
  /// Bytes the chips sent each other moving layers chip to chip, as their
  /// channels counted them (0 through the scheduler).
  double sent_bytes = 0;
  /// The moves' link time, charged on the virtual clock.
  double charged_seconds = 0;
  /// Wall time training stood still for it.
  double pause_seconds = 0;
  /// Predicted step seconds of the old and the new plan under the live
  /// measurements (0: not predicted, a forced re-plan).
  double before_seconds = 0;
  double after_seconds = 0;
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

  /// The job moved to another plan between two steps.
  virtual void on_rebalance(const rebalance_event& e) {}
};

/// Passes every callback to each of its observers, in their order.
class observer_fanout final : public training_observer {
public:
  explicit observer_fanout(std::vector<training_observer*> to)
      : to_(std::move(to)) {}

  void on_setup(const plan& p, const std::vector<setup_report>& c) override {
    for (auto* o : to_)
      o->on_setup(p, c);
  }
  void on_step(const step_summary& s) override {
    for (auto* o : to_)
      o->on_step(s);
  }
  void on_eval(int step, double val_loss) override {
    for (auto* o : to_)
      o->on_eval(step, val_loss);
  }
  void on_checkpoint(int steps, double waited_seconds,
                     double stall_seconds) override {
    for (auto* o : to_)
      o->on_checkpoint(steps, waited_seconds, stall_seconds);
  }
  void on_rebalance(const rebalance_event& e) override {
    for (auto* o : to_)
      o->on_rebalance(e);
  }

private:
  std::vector<training_observer*> to_;
};

/// Keeps every step summary and validation loss (tests, benchmarks, tools).
class step_recorder : public training_observer {
public:
  void on_step(const step_summary& s) override { steps.push_back(s); }
  void on_eval(int, double loss) override { val_losses.push_back(loss); }
  void on_rebalance(const rebalance_event& e) override {
    rebalances.push_back(e);
  }

  /// The training loss of every step so far.
  std::vector<double> losses() const {
    std::vector<double> out;
    for (const auto& s : steps)
      out.push_back(s.loss);
    return out;
  }

  std::vector<step_summary> steps;
  std::vector<double> val_losses;
  std::vector<rebalance_event> rebalances;
};

} // namespace h2::runtime
