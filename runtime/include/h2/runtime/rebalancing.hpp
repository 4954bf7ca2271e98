// Live rebalancing in a running job (docs/rebalance.md): the policy
// (scheduler/rebalance.hpp) over HeteroAuto's measurements of the job's
// chips, and the translation of the chips' step reports into the policy's
// observations. No actors: the scheduler actor owns one and feeds it.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/runtime/auto_plan.hpp"
#include "h2/runtime/reports.hpp"
#include "h2/scheduler/rebalance.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace h2::runtime {

/// What the policy observes of one step: per chip the charged per-layer
/// times (chip_step_report::layers), the optimizer's charged (virtual)
/// seconds, idle time and peak memory; per pipeline link the mean charged
/// seconds of one transfer. `updates` may be empty (no optimizer figures).
scheduler::step_observations
observations_of(int step, const std::vector<chip_step_report>& steps,
                const std::vector<chip_update_report>& updates);

/// The live-rebalancing state of one run: the job's profiled measurements
/// (HeteroAuto's, taken lazily, as plan.mode = "auto" takes them) and the
/// policy over them, starting from the plan the run starts with.
class rebalancer {
public:
  /// Throws config_error for a bad job.rebalance.
  rebalancer(std::shared_ptr<const job_config> job, const plan& current);

  scheduler::rebalance_policy& policy() noexcept { return policy_; }
  const scheduler::rebalance_policy& policy() const noexcept { return policy_; }

private:
  std::shared_ptr<const job_config> job_;
  profiled_measurements measurements_;
  scheduler::rebalance_policy policy_;
};

/// Where a running job stands, for h2-admin status.
struct run_status {
  int step = 0;  ///< steps done
  int steps = 0; ///< the run's last step
  int generation = 0;
  std::string phase = "running"; ///< runtime::run_phase
  bool paused = false;
  double last_step_seconds = 0;        ///< run clock
  std::map<chip_id, double> throttles; ///< factors set by drills or admins
};

/// h2-admin status --json (docs/admin.md): the job, the step, the running
/// plan, per chip its stage, layers, throttle and what the policy observed
/// of it (speed against its profile, idle time, peak memory), and the
/// policy's state. `policy` may be null (no live rebalancing).
std::string status_json(const job_config& job, const plan& running,
                        const run_status& status,
                        const scheduler::rebalance_policy* policy);

} // namespace h2::runtime
