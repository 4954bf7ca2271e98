// What the scheduler and the actors that start it share
// (scheduler_actor.hpp): the time a chip has to answer, how a request that
// failed is named, and the check of forced re-plans.
#include "h2/actors/scheduler_actor.hpp"

#include "h2/scheduler/plan_builder.hpp"

#include <cmath>
#include <sstream>

namespace h2::actors {

std::chrono::milliseconds step_timeout(const job_config& job) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(
    std::ceil(job.runtime.step_timeout_seconds * 1000)));
}

failure request_failure(const caf::error& e, const job_config& job,
                        const chip_id& chip) {
  if (e != caf::sec::request_timeout)
    return to_failure(e);
  std::ostringstream msg;
  msg << "chip " << chip.to_string() << " did not answer within "
      << job.runtime.step_timeout_seconds
      << " s (runtime.step_timeout_seconds)";
  return {errc::step_timeout, msg.str()};
}

void check_replans(const std::map<int, plan>& replans, const plan& start,
                   const job_config& job) {
  for (const auto& [step, p] : replans) {
    const std::string where = "the re-plan before step " + std::to_string(step);
    scheduler::check_plan(p, job, where);
    if (plan_chips(p) != plan_chips(start))
      throw config_error(where, "a live re-plan keeps the chips and their "
                                "order; this one changes them (that needs "
                                "a checkpoint and a restart)");
  }
}

} // namespace h2::actors
