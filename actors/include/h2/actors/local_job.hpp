// A whole job in one process: every chip of the plan as a detached chip
// actor, in-process channels between neighbouring stages, the scheduler
// actor driving them. What `h2-launch` runs.
#pragma once

#include "h2/runtime/admin.hpp"

#include "h2/actors/errors.hpp"
#include "h2/actors/fwd.hpp"
#include "h2/core/cancellation.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/checkpointing.hpp"
#include "h2/runtime/observer.hpp"
#include "h2/transport/channel.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/fwd.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace h2::actors {

/// Registers H2's message types and error category with a CAF config and
/// sets up its scheduler for detached chip actors.
void configure_actor_system(caf::actor_system_config& cfg);

/// What to run.
struct run_options {
  run_options(int end_step = 1, bool collect = false)
      : steps(end_step), collect_parameters(collect) {}

  /// The step the run ends after (train.steps for a whole run; fewer to stop
  /// early, as --stop-after does, without changing the schedule).
  int steps = 1;
  /// Keep a copy of every parameter at the end (parameters()).
  bool collect_parameters = false;
  /// A checkpoint to continue (check_resumable passed): its state is loaded
  /// into the chips and training starts at its step. Null: from scratch.
  std::shared_ptr<const runtime::checkpoint> resume;
  /// The job file's text, recorded in the manifest of every checkpoint the
  /// run saves (the job's [checkpoint]).
  std::string job_text;
  /// Live re-plans (docs/rebalance.md): before step k starts the job moves
  /// to `replans[k]`, which must hold the plan's chips in the same order
  /// (other layer boundaries, micro-batching, recomputation); chips hand
  /// their layers and optimizer state to the new owners. run() throws
  /// config_error naming the step otherwise.
  std::map<int, plan> replans;
  /// The admin endpoint's way in (docs/admin.md): the run attaches its
  /// scheduler takes commands from it while it trains. Null: no admin.
  std::shared_ptr<runtime::admin_inbox> admin;
};

class local_job {
public:
  /// `p` must be valid for `job` (validate_plan).
  local_job(std::shared_ptr<const job_config> job, plan p);
  ~local_job();

  local_job(const local_job&) = delete;
  local_job& operator=(const local_job&) = delete;

  /// Trains until opts.steps steps are done (from opts.resume's step, or
  /// 0), reporting to `observer`, stopping early at a step boundary once
  /// `*stop` is non-zero (`stop` may be null). With the job's [checkpoint],
  /// saves every checkpoint.every steps and at the end (a stop included),
  /// and returns once the last save is on disk. Blocks. Throws run_error
  /// with the root cause when a chip fails (every chip is stopped and every
  /// resource released first), errc::checkpoint when a save fails.
  runtime::run_summary run(const run_options& opts,
                           runtime::training_observer& observer,
                           std::shared_ptr<std::atomic<int>> stop = nullptr);

  /// The parameters at the end of the last run, in global layer order (of
  /// replica 0), when it was asked to collect them.
  const std::vector<runtime::parameter_values>& parameters() const noexcept {
    return parameters_;
  }

  /// The parameters of one chip at the end of the last run (collected with
  /// the others); empty for chips outside the plan.
  std::vector<runtime::parameter_values>
  parameters_of(const chip_id& chip) const;

  /// Fails the step in flight at once: cancels every chip's waits and op
  /// loop, closes every channel and abandons a checkpoint being written (the
  /// previous one stays the latest). A run aborted before it starts fails
  /// at once. Thread-safe; may be called from a signal watcher.
  void abort() noexcept;

private:
  /// The run's context: the plan, the re-plans, the checkpoint writer, the
  /// watchdog (no chips yet).
  std::shared_ptr<run_context>
  context_of(const run_options& opts, runtime::training_observer& observer,
             std::shared_ptr<std::atomic<int>> stop);
  /// Wires every pair of chips in-process and spawns the chip actors, each
  /// with its layers' state when the run resumes.
  void spawn_chips(caf::actor_system& system, run_context& ctx,
                   const run_options& opts);
  /// Asks every chip for its parameters (parameters(), parameters_of()).
  std::optional<failure> collect_parameters(caf::scoped_actor& self,
                                            const run_context& ctx);
  /// Ends the writer and closes every channel; a failed run first gives up
  /// its save in progress and cancels the chips' work.
  void release(run_context& ctx, bool failed);

  std::shared_ptr<const job_config> job_;
  plan plan_;
  std::shared_ptr<cancellation> cancel_ = std::make_shared<cancellation>();
  std::mutex mutex_;
  std::vector<std::shared_ptr<transport::channel>> channels_;
  std::shared_ptr<runtime::checkpoint_writer> writer_; ///< during a run
  std::vector<runtime::parameter_values> parameters_;
  std::map<chip_id, std::vector<runtime::parameter_values>> chip_parameters_;
};

} // namespace h2::actors
