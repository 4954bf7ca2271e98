// What the live page of a run shows (docs/admin.md, "Live page"): the plan,
// each chip's last step (utilisation, bubble, memory), loss and tokens/s
// over the steps, the last step's measured timeline and the run's events.
// A training_observer: its callbacks record on the scheduler's thread, the
// HTTP server's threads read. Pure: no actors, no torch.
#pragma once

#include "h2/core/job.hpp"
#include "h2/runtime/observer.hpp"
#include "h2/scheduler/simulator.hpp"

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace h2::runtime {

/// The last step's ops as a timeline render_svg draws: one row per chip
/// (its replica and pipeline position), compute, all-reduce and optimizer
/// ops as intervals from the step's first op; waits are left out (the
/// rows' background shows them). Ops of chips the step has no stats of
/// are skipped.
scheduler::simulation measured_timeline(const step_summary& s);

class run_view final : public training_observer {
public:
  /// Points each series (loss, tokens/s) keeps: past it, every other point
  /// is dropped and only every 2nd (4th, ...) step recorded, counted from
  /// the first step of this process (a resumed run's too).
  static constexpr std::size_t max_points = 1024;
  /// Events kept (the newest).
  static constexpr std::size_t max_events = 100;

  /// `job` must outlive the view.
  explicit run_view(const job_config& job, int total_steps);

  void on_setup(const plan& p, const std::vector<setup_report>& chips) override;
  void on_step(const step_summary& s) override;
  void on_eval(int step, double val_loss) override;
  void on_checkpoint(int steps, double waited_seconds,
                     double stall_seconds) override;
  void on_rebalance(const rebalance_event& e) override;

  /// The run is over (the page stops asking for more).
  void finish(const run_summary& s);

  /// Everything the page shows but the timeline, as JSON (docs/admin.md,
  /// "Live page", lists the fields).
  std::string state_json() const;

  /// The last step's timeline (measured_timeline) as SVG; nullopt before
  /// the first step or when its ops were not recorded (the other nodes of
  /// a job in several processes). Drawn outside the lock: training does not
  /// wait for it.
  std::optional<std::string> timeline_svg() const;

private:
  struct event {
    int step = 0;
    std::string kind; ///< "plan", "rebalance", "checkpoint", "eval", "end"
    std::string text;
  };
  void add_event(int step, std::string kind, std::string text);
  std::string row_label(const chip_id& chip) const;

  const job_config& job_;
  const int total_steps_;
  mutable std::mutex mutex_;
  std::string status_ = "starting"; ///< "training", "done", "stopped"
  std::optional<plan> plan_;
  int generation_ = 0;
  std::map<chip_id, memory_report> setup_memory_;
  /// Shared with readers drawing its timeline outside the lock.
  std::shared_ptr<const step_summary> last_;
  int steps_done_ = 0;     ///< the last step's number + 1 (a resume's too)
  int first_step_ = -1;    ///< the first step this process recorded
  std::size_t stride_ = 1; ///< steps per recorded point
  std::vector<int> steps_;
  std::vector<double> losses_, tokens_per_second_;
  std::deque<event> events_;
  /// The last timeline drawn, and the step it was drawn from.
  struct drawing {
    std::shared_ptr<const step_summary> from;
    std::string svg;
  };
  mutable std::shared_ptr<const drawing> svg_;
};

} // namespace h2::runtime
