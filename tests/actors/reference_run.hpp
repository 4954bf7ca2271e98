// Running a job through actors, and the single-chip reference trainer the
// exactness tests compare with (job fixtures: tests/test_jobs.hpp).
#pragma once

#include "h2/actors/local_job.hpp"
#include "h2/core/job.hpp"
#include "h2/model/data.hpp"
#include "h2/model/optim.hpp"
#include "h2/model/stage.hpp"
#include "h2/model/trainer.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "h2/scheduler/schedule.hpp"

#include <ATen/Parallel.h>

#include <memory>
#include <string>
#include <vector>

namespace h2::test {

using recording_observer = runtime::step_recorder;

/// Runs `job` with the plan its [plan] table describes.
inline runtime::run_summary
run_job(const job_config& job, recording_observer& obs,
        std::vector<runtime::parameter_values>* params = nullptr) {
  auto shared = std::make_shared<job_config>(job);
  actors::local_job local(shared, scheduler::make_plan(job));
  auto summary = local.run({job.train.steps, params != nullptr}, obs);
  if (params != nullptr)
    *params = local.parameters();
  return summary;
}

/// The same training on one chip, without actors or channels
/// (model::single_chip_trainer), gradients accumulated in the order the
/// schedule's stages run their backwards. One intra-op thread, fp32.
struct reference_result {
  std::vector<double> losses;
  std::vector<runtime::parameter_values> params;
};

inline reference_result train_reference(const job_config& job,
                                        schedule_kind kind, int stages) {
  at::set_num_threads(1);
  const int m = job.train.global_batch / job.train.micro_batch;
  // Every chunk of GPipe, 1F1B, interleaved 1F1B and ZB-H1 accumulates its
  // weight gradients in the same order (fused backwards, or W); take the
  // first chunk's. `stages` counts chips (of job.plan.chunks_per_chip
  // chunks each).
  std::vector<int> order;
  const auto schedule = scheduler::make_schedule(
    kind,
    scheduler::pipeline_layout::dealt(std::vector<int>(
      static_cast<std::size_t>(stages),
      kind == schedule_kind::interleaved_1f1b ? job.plan.chunks_per_chip : 1)),
    m);
  for (const auto& op : schedule.ops[0])
    if (op.chunk == 0 && (op.kind == scheduler::op_kind::backward ||
                          op.kind == scheduler::op_kind::backward_weight))
      order.push_back(op.micro_batch);
  model::single_chip_trainer trainer(job);
  reference_result out;
  for (int step = 0; step < job.train.steps; ++step)
    out.losses.push_back(trainer.train_step(step, order));
  for (const auto& l : trainer.model().layers())
    for (const auto& p : l->parameters()) {
      auto t = p.value.detach().contiguous();
      const float* d = t.data_ptr<float>();
      out.params.push_back(
        {p.name, t.sizes().vec(), std::vector<float>(d, d + t.numel())});
    }
  return out;
}

} // namespace h2::test
