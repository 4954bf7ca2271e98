#include "h2/runtime/step_control.hpp"

#include "h2/core/error.hpp"
#include "h2/model/optim.hpp"

#include <algorithm>
#include <cmath>

namespace h2::runtime {

update_decision decide_update(const job_config& job, int step,
                              const std::vector<chip_step_report>& steps) {
  update_decision d;
  d.grad_norm = grad_norm_of(steps);
  if (!std::isfinite(d.grad_norm)) {
    double loss = 0;
    for (const auto& r : steps)
      loss += r.loss;
    throw h2::error("step " + std::to_string(step + 1) +
                    ": the global gradient norm is not finite (loss " +
                    std::to_string(loss) +
                    "); lower train.lr or enable train.grad_clip");
  }
  d.command.step = step;
  d.command.clip_coefficient =
    model::clip_coefficient(d.grad_norm, job.train.grad_clip);
  d.command.lr = model::learning_rate(job.train, step);
  d.command.virtual_barrier = virtual_phase_end(steps);
  return d;
}

bool eval_due(const job_config& job, int completed, int steps) {
  const int every = job.train.eval_every;
  return every > 0 && (completed % every == 0 || completed == steps);
}

void run_totals::add(const step_summary& s,
                     const std::vector<chip_update_report>& updates,
                     std::int64_t tokens_per_step) {
  summary_.steps = s.step + 1;
  summary_.final_loss = s.loss;
  summary_.virtual_seconds = s.virtual_end;
  for (const auto& u : updates)
    summary_.wall_seconds = std::max(summary_.wall_seconds, u.end.wall_seconds);
  if (s.step > 0 || steps_ == 1) {
    timed_seconds_ += s.step_seconds;
    timed_tokens_ += static_cast<double>(tokens_per_step);
  }
  bubble_sum_ += s.bubble_fraction;
}

run_summary run_totals::summary(bool stopped_early) const {
  run_summary s = summary_;
  s.stopped_early = stopped_early;
  if (timed_seconds_ > 0) {
    s.mean_step_seconds = timed_seconds_ / std::max(1, s.steps - 1);
    s.tokens_per_second = timed_tokens_ / timed_seconds_;
  }
  s.mean_bubble_fraction = s.steps > 0 ? bubble_sum_ / s.steps : 0;
  return s;
}

} // namespace h2::runtime
