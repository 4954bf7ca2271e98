// The scheduler actor: starts steps on every chip, collects their timings,
// memory and losses, reduces the global gradient norm between the backward
// and the optimizer phase, runs validation, and reports to the observer.
// Event-based: it never blocks; the chips do the work.
#pragma once

#include "h2/actors/errors.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/runtime/checkpointing.hpp"
#include "h2/runtime/observer.hpp"
#include "h2/runtime/watchdog.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

namespace h2::actors {

/// What the scheduler actor drives.
struct run_context {
  std::shared_ptr<const job_config> job;
  plan the_plan;
  std::vector<caf::actor> chips; ///< every chip actor of the plan
  runtime::training_observer* observer = nullptr; ///< outlives the run
  /// Set (to 1) to stop at the next step boundary.
  std::shared_ptr<std::atomic<int>> stop;
  /// Steps already trained (a resumed run starts there; its chips loaded
  /// their layers at set-up).
  int first_step = 0;
  /// Live re-plans: before step k starts, the job moves to plan
  /// `replans[k]` (the same chips in the same order: other layer
  /// boundaries, micro-batching, recomputation). Chips hand their layers,
  /// with the optimizer's state, to their new owners (docs/rebalance.md).
  std::map<int, plan> replans;
  /// The driving node's checkpoint writer (the job's [checkpoint]): it
  /// publishes each checkpoint's manifest once every chip's layer files are
  /// written; null: no checkpoints.
  std::shared_ptr<runtime::checkpoint_writer> checkpoints;
  /// What every checkpoint's manifest says of the job (runtime::
  /// job_manifest, made once per run); the saver sets its step.
  runtime::checkpoint_manifest manifest;
  /// Admin commands (docs/admin.md): the scheduler opens it when training
  /// starts and answers what arrives between its messages. Null: none.
  std::shared_ptr<runtime::admin_inbox> admin;
  /// This process's progress watchdog, suspended while a rebalance, a
  /// pause or a checkpoint wait is in progress (null: none).
  std::shared_ptr<runtime::progress_watchdog> watchdog;
};

/// How long one per-step request to a chip (set-up, step, update,
/// validation, parameters) may take: the job's
/// runtime.step_timeout_seconds (docs/job-file.md).
std::chrono::milliseconds step_timeout(const job_config& job);

/// The failure of a per-step request to `chip`: a timeout (CAF's
/// request_timeout) becomes errc::step_timeout naming the chip and the key,
/// anything else to_failure(e).
failure request_failure(const caf::error& e, const job_config& job,
                        const chip_id& chip);

/// Checks live re-plans against the plan a run starts with: each valid for
/// `job` and holding its chips in the same order. Throws config_error
/// naming "the re-plan before step K".
void check_replans(const std::map<int, plan>& replans, const plan& start,
                   const job_config& job);

/// Spawns the scheduler actor. After setting up every chip, it trains from
/// ctx->first_step until `steps` steps are done or a stop, saving a
/// checkpoint every checkpoint.every steps and at the end when
/// ctx->checkpoints is set (docs/checkpoints.md), and answers (train_atom,
/// int steps) with a runtime::run_summary once the last checkpoint is on
/// disk, or with the root cause of a failure as an H2 caf::error.
caf::actor spawn_scheduler(caf::actor_system& system,
                           std::shared_ptr<run_context> ctx);

} // namespace h2::actors
