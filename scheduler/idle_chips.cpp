// Why a plan leaves chips idle (docs/planner.md, "Every chip or a reason"):
// HeteroAuto keeps the fastest plan it finds, and that may use fewer chips
// than it was given (a slow kind would lengthen every pipeline it joins).
// Then the best plan that uses every chip is solved too, and the report
// says how much slower it is predicted, or that none fits.
#include "planner_impl.hpp"

#include <limits>
#include <map>
#include <set>

namespace h2::scheduler {

namespace {

int chips_of(const pipeline_candidate& c) {
  int n = 0;
  for (const auto& g : c.groups)
    for (const auto& r : g.replicas)
      n += static_cast<int>(std::set<int>(r.begin(), r.end()).size());
  return n;
}

/// "ascend-910b x16, h100-sxm x2": the kinds of `idle`.
std::string kinds_text(const std::vector<const chip_spec*>& idle) {
  std::map<std::string, int> kinds;
  for (const auto* c : idle)
    ++kinds[c->profile.name];
  std::string out;
  for (const auto& [name, n] : kinds)
    out += (out.empty() ? "" : ", ") + name + " x" + std::to_string(n);
  return out;
}

} // namespace

void explain_idle_chips(planner::impl& im,
                        const std::vector<pipeline_candidate>& candidates,
                        const stage_two_result& best, plan_report& report) {
  const auto used = plan_chips(best.value);
  const std::set<chip_id> in_plan(used.begin(), used.end());
  std::vector<const chip_spec*> idle;
  for (const auto* c : im.chips)
    if (in_plan.count(c->id) == 0)
      idle.push_back(c);
  report.idle_chips = static_cast<int>(idle.size());
  if (idle.empty())
    return;
  const int all = static_cast<int>(im.chips.size());
  double step = std::numeric_limits<double>::infinity();
  std::string shape;
  for (const auto& c : candidates) {
    if (chips_of(c) != all)
      continue;
    auto r = im.stage_two(c, step);
    if (r.feasible && r.step_seconds < step) {
      step = r.step_seconds;
      shape = c.description;
    }
  }
  std::string why = std::to_string(idle.size()) + " chip" +
                    (idle.size() == 1 ? "" : "s") + " idle (" +
                    kinds_text(idle) + "): ";
  if (!shape.empty())
    report.all_chips_step_seconds = step;
  if (shape.empty())
    why += "no plan that uses every chip fits";
  else
    why += "the best plan that uses every chip, " + shape + ", is predicted " +
           seconds_text(step) + " per step";
  report.idle_reason = why; // explain() adds the ratio to this plan's step
}

} // namespace h2::scheduler
