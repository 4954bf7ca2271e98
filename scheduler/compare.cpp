#include "h2/scheduler/compare.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace h2::scheduler {

comparison compare_with_baselines(const job_config& job,
                                  chip_measurements& measurements,
                                  const planner_options& options,
                                  const plan_report& best) {
  comparison out;
  planner pl(job, measurements, options);
  const auto& chips = pl.chips();

  // The even plan over the same chips, as plan.mode = "even" would run it.
  std::vector<chip_id> planned_chips;
  for (const auto* c : chips)
    planned_chips.push_back(c->id);
  out.even.name = "even (" + std::to_string(chips.size()) +
                  " stages, micro-batch " +
                  std::to_string(job.train.micro_batch) + ")";
  out.even.chips = static_cast<int>(chips.size());
  out.even.global_batch = job.train.global_batch;
  if (static_cast<int>(chips.size()) * job.plan.chunks_per_chip >
      job.model.num_layers()) {
    out.even.why_not = "more chunks than layers";
  } else {
    out.even.value = even_plan(job, planned_chips);
    auto r = pl.evaluate(out.even.value);
    out.even.feasible = r.fits;
    out.even.step_seconds = r.step_seconds;
    out.even.tokens_per_second = r.tokens_per_second;
    if (!r.fits)
      out.even.why_not = "a stage exceeds its memory";
  }

  // Each chip kind alone, with its share of the batch.
  std::map<std::string, std::vector<chip_id>> kinds;
  for (const auto* c : chips)
    kinds[chip_kind_key(*c)].push_back(c->id);
  for (const auto& [kind, ids] : kinds) {
    baseline b;
    b.name = kind;
    b.chips = static_cast<int>(ids.size());
    job_config part = job;
    part.train.global_batch = std::max<int>(
      1,
      static_cast<int>(std::lround(static_cast<double>(job.train.global_batch) *
                                   static_cast<double>(ids.size()) /
                                   static_cast<double>(chips.size()))));
    b.global_batch = part.train.global_batch;
    planner_options o = options;
    o.chips = ids;
    o.suggest_changes = false;
    o.rank_candidates = false;
    try {
      auto r = plan_auto(part, measurements, o);
      b.feasible = true;
      b.step_seconds = r.report.step_seconds;
      b.tokens_per_second = r.report.tokens_per_second;
      b.value = std::move(r.value);
      out.homogeneous_tokens_per_second += b.tokens_per_second;
    } catch (const infeasible_error&) {
      b.why_not = "the model does not fit";
    }
    out.homogeneous.push_back(std::move(b));
  }
  if (out.homogeneous_tokens_per_second > 0)
    out.super_linear_ratio =
      best.tokens_per_second / out.homogeneous_tokens_per_second;
  return out;
}

job_config sub_cluster(const job_config& full, int stride) {
  H2_ENFORCE(stride >= 1, "stride=", stride);
  job_config job = full;
  job.nodes.clear();
  job.plan.stages.clear();
  int rank = 0;
  for (std::size_t n = 0; n < full.nodes.size();
       n += static_cast<std::size_t>(stride)) {
    node_spec node = full.nodes[n];
    node.rank = rank;
    for (auto& c : node.chips) {
      c.id.node = rank;
      job.plan.stages.push_back(c.id);
    }
    job.nodes.push_back(std::move(node));
    ++rank;
  }
  job.train.global_batch = std::max(1, full.train.global_batch / stride);
  return job;
}

} // namespace h2::scheduler
