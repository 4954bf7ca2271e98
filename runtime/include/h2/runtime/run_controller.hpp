// The control plane of a run, without actors (docs/admin.md, "States and
// commands"): where the run stands (running, paused, saving, rebalancing,
// stopping), what the scheduler does at each step boundary, and what every
// admin command does in every state. The scheduler actor
// (actors/scheduler_actor.cpp) asks it at each boundary and routes the
// admin inbox's commands to it; it carries out what comes back (a save,
// drills, a re-plan, a step) and tells it when each ends.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/runtime/rebalancing.hpp"
#include "h2/runtime/reports.hpp"

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace h2::runtime {

/// Where a run stands, as h2-admin status reports it. `saving` overlaps
/// training (a checkpoint's files are written while steps go on); the
/// others are exclusive, and the first that applies names the phase:
/// stopping, rebalancing, paused, saving, running.
enum class run_phase { running, paused, saving, rebalancing, stopping };

std::string_view to_string(run_phase p) noexcept;

/// A plan to move to at a step boundary, and why.
struct plan_change {
  plan value;
  std::string reason; ///< "--replan", "admin plan", a policy's reason
  /// Predicted step seconds of the old and the new plan (0: not predicted).
  double before_seconds = 0;
  double after_seconds = 0;

  static plan_change of(const scheduler::rebalance_proposal& p);
};

/// What the scheduler does at a step boundary, the first that applies in
/// this order: finish (all steps done, or a stop requested), a checkpoint
/// an admin asked for, the drills due (job [[drills]], h2-admin
/// throttle), a re-plan (forced by --replan, else a pending one), hold
/// (paused), step.
struct boundary_action {
  enum class kind { finish, checkpoint, drills, replan, hold, step };
  kind what = kind::step;
  bool stopped_early = false;        ///< finish
  std::vector<drill> drills;         ///< drills, in order
  std::optional<plan_change> change; ///< replan
};

/// What an admin command answers, and what the scheduler must do now.
struct admin_outcome {
  std::string json; ///< the answer's result, a JSON text
  /// A held (paused) step boundary is to be taken again now: the command
  /// resumed or stopped a paused run, or left work for the boundary (a
  /// checkpoint, a move, a throttle), which a paused run does at once and
  /// then holds again.
  bool release = false;
};

class run_controller {
public:
  struct options {
    std::shared_ptr<const job_config> job;
    plan start;         ///< the plan the run starts with
    int first_step = 0; ///< steps done before (a resumed run)
    int steps = 0;      ///< the run ends after step `steps`
    /// Live re-plans forced before given steps (h2-launch --replan).
    std::map<int, plan> replans;
    /// Set by signals and by h2-admin stop; read at every boundary.
    std::shared_ptr<std::atomic<int>> stop;
    bool checkpoints = false; ///< the job saves checkpoints
    /// Keep a rebalancing policy (the job's [rebalance] is on, or admins
    /// may ask for one).
    bool rebalancing = false;
  };

  /// Throws config_error for a bad [rebalance].
  explicit run_controller(options o);

  int step() const noexcept { return step_; }
  int steps() const noexcept { return steps_; }
  int generation() const noexcept { return generation_; }
  run_phase phase() const noexcept;
  bool stop_requested() const noexcept;

  /// The step boundary's action. Taking it consumes it: the checkpoint
  /// request, the drills and the pending plan are handed out once; `hold`
  /// leaves the run paused until an outcome with `release`.
  boundary_action at_boundary();

  /// A step ended: counts it, hands its reports to the policy (which may
  /// leave a plan pending) and says whether a periodic checkpoint is due
  /// now (checkpoint.every). Throws what the policy throws.
  bool step_ended(double step_seconds,
                  const std::vector<chip_step_report>& steps,
                  const std::vector<chip_update_report>& updates);

  /// A checkpoint's save started and ended (its files are written and its
  /// manifest published).
  void save_started() noexcept { saving_ = true; }
  void save_ended() noexcept { saving_ = false; }

  /// A re-plan started; it ended with `now` running: the policy adopts
  /// it from this step on. Returns the new plan's generation.
  void replan_started() noexcept { rebalancing_ = true; }
  int replan_ended(const plan& now);

  /// A drill was applied: its chip now runs `factor` times slower.
  void drill_applied(const drill& d) { throttles_[d.chip] = d.factor; }

  /// Carries out an admin command on the run with `running` as its plan;
  /// throws admin_error (or config_error for a bad plan) when it cannot be
  /// done, and changes nothing then. docs/admin.md lists what each command
  /// does in each phase.
  admin_outcome execute(const admin_command& cmd, const plan& running);

private:
  std::string status(const plan& running) const;
  admin_outcome rebalance(const admin_command& cmd, const plan& running);
  admin_outcome throttle(const admin_command& cmd, const plan& running);
  void refuse_when_stopping(std::string_view command) const;

  std::shared_ptr<const job_config> job_;
  int step_;
  int steps_;
  std::map<int, plan> replans_;
  std::shared_ptr<std::atomic<int>> stop_;
  bool checkpoints_;
  std::unique_ptr<rebalancer> rebalancer_;

  int generation_ = 0;         ///< plans adopted since the start
  std::size_t next_drill_ = 0; ///< index into job.drills
  std::vector<drill> due_drills_;
  std::map<chip_id, double> throttles_;
  std::optional<plan_change> pending_;
  bool pause_requested_ = false;
  bool held_ = false; ///< paused at a boundary
  bool checkpoint_requested_ = false;
  bool rebalancing_ = false;
  bool saving_ = false;
  bool finishing_ = false; ///< at_boundary said finish
  double last_step_seconds_ = 0;
};

} // namespace h2::runtime
