// HeteroAuto over every schedule (docs/planner.md, "Choosing a schedule"):
// each planned alone, the fastest kept.
#include "h2/scheduler/planner.hpp"

#include <algorithm>

namespace h2::scheduler {

bool searches_schedules(const job_config& job,
                        const planner_options& options) noexcept {
  return options.search_schedules ||
         (!options.schedule && job.plan.search_schedule);
}

std::vector<schedule_choice>
plan_each_schedule(const job_config& job, chip_measurements& measurements,
                   const planner_options& options) {
  std::vector<schedule_choice> out;
  for (auto kind : all_schedule_kinds) {
    if (!schedule_unavailable(kind).empty())
      continue;
    planner_options o = options;
    o.schedule = kind;
    o.search_schedules = false;
    schedule_choice c;
    c.schedule = kind;
    try {
      planner p(job, measurements, o);
      c.result = p.run();
    } catch (const infeasible_error&) {
      c.error = std::current_exception();
    }
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.result.has_value() != b.result.has_value())
      return a.result.has_value();
    return a.result &&
           a.result->report.step_seconds < b.result->report.step_seconds;
  });
  return out;
}

planned plan_auto(const job_config& job, chip_measurements& measurements,
                  const planner_options& options) {
  if (!searches_schedules(job, options)) {
    planner p(job, measurements, options);
    return p.run();
  }
  auto choices = plan_each_schedule(job, measurements, options);
  if (choices.front().result)
    return std::move(*choices.front().result);
  for (const auto& c : choices)
    if (c.schedule == schedule_kind::one_f_one_b)
      std::rethrow_exception(c.error);
  std::rethrow_exception(choices.front().error);
}

} // namespace h2::scheduler
