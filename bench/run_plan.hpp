// Benchmarks that train a plan for a few steps in this process
// (actors::local_job) and time its steps.
#pragma once

#include "h2/actors/local_job.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"

#include <memory>

namespace h2::bench {

/// Mean step seconds of steps [skip, steps) of `p` trained on `job` (its
/// clock: virtual or wall). Throws what local_job throws (a plan that does
/// not fit fails with the chip's out-of-memory error).
inline double mean_step_seconds(std::shared_ptr<const job_config> job,
                                const plan& p, int steps, int skip) {
  actors::local_job local(std::move(job), p);
  runtime::step_recorder c;
  local.run({steps, false}, c);
  double total = 0;
  for (int i = skip; i < steps; ++i)
    total += c.steps[static_cast<std::size_t>(i)].step_seconds;
  return total / (steps - skip);
}

} // namespace h2::bench
