// A whole job in one process: every chip of the plan as a detached chip
// actor, in-process channels between neighbouring stages, the scheduler
// actor driving them. What `h2-launch` runs.
#pragma once

#include "h2/actors/observer.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/transport/channel.hpp"

#include <caf/actor_system_config.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace h2::actors {

/// Registers H2's message types and error category with a CAF config.
void register_types(caf::actor_system_config& cfg);

class local_job {
public:
  /// `p` must be valid for `job` (validate_plan).
  local_job(std::shared_ptr<const job_config> job, plan p);
  ~local_job();

  local_job(const local_job&) = delete;
  local_job& operator=(const local_job&) = delete;

  /// Trains `steps` steps, reporting to `observer`, stopping early at a step
  /// boundary once `*stop` is non-zero. Blocks. Throws run_error with the
  /// root cause when a chip fails (every chip is stopped and every resource
  /// released first).
  run_summary run(int steps, training_observer& observer,
                  std::shared_ptr<std::atomic<int>> stop);

  /// Fails the step in flight at once: closes every channel so every wait
  /// ends with `cancelled`. Thread-safe; may be called from a signal watcher.
  void abort() noexcept;

private:
  std::shared_ptr<const job_config> job_;
  plan plan_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<transport::channel>> channels_;
  bool aborted_ = false;
};

} // namespace h2::actors
