#include "h2/scheduler/plan_builder.hpp"

#include "h2/core/error.hpp"

namespace h2::scheduler {

std::vector<int> even_split(int layers, int stages) {
  H2_ENFORCE(stages >= 1 && layers >= stages, "layers=", layers,
             " stages=", stages);
  std::vector<int> out(static_cast<std::size_t>(stages), layers / stages);
  for (int i = 0; i < layers % stages; ++i)
    ++out[static_cast<std::size_t>(i)];
  return out;
}

plan make_plan(const job_config& job) {
  const auto& pc = job.plan;
  if (pc.mode == plan_mode::automatic)
    throw config_error("plan.mode",
                       "\"auto\" plans are made by HeteroAuto "
                       "(scheduler::plan_auto, apps::plan_job), not by "
                       "make_plan; or run h2-plan JOB --json > plan.json "
                       "and h2-launch JOB --plan plan.json");
  const int stages = static_cast<int>(pc.stages.size());
  std::vector<int> counts = pc.mode == plan_mode::manual
                              ? pc.layers
                              : even_split(job.model.num_layers(), stages);
  plan p;
  p.schedule = pc.schedule;
  replica_plan r;
  r.micro_batch_size = job.train.micro_batch;
  r.micro_batches = job.train.global_batch / job.train.micro_batch;
  int next = 0;
  for (int s = 0; s < stages; ++s) {
    stage_plan sp;
    sp.chip = pc.stages[static_cast<std::size_t>(s)];
    sp.first_layer = next;
    sp.end_layer = next += counts[static_cast<std::size_t>(s)];
    sp.recompute =
      pc.recompute.empty() ? false : pc.recompute[static_cast<std::size_t>(s)];
    r.stages.push_back(sp);
  }
  p.replicas.push_back(std::move(r));
  validate_plan(p, job, "plan");
  return p;
}

plan even_plan(const job_config& job, const std::vector<chip_id>& chips) {
  if (chips.empty())
    throw config_error("plan.stages", "no chips for an even plan");
  if (static_cast<int>(chips.size()) > job.model.num_layers())
    throw config_error("plan.stages",
                       std::to_string(chips.size()) +
                         " chips for an even plan but the model has only " +
                         std::to_string(job.model.num_layers()) + " layers");
  job_config even = job;
  even.plan.mode = plan_mode::even;
  even.plan.stages = chips;
  even.plan.layers.clear();
  even.plan.recompute.assign(chips.size(), false);
  return make_plan(even);
}

} // namespace h2::scheduler
