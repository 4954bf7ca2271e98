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

} // namespace h2::scheduler
