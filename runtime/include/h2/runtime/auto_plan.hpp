// plan.mode = "auto": the profiling pass on the job's chips
// (model::chip_profiler) as the planner's measurements, and the planner run
// on them. The one adapter from chips to planner measurements: h2-plan,
// h2-launch (plan_job()), the benchmarks and the prediction tests use it.
#pragma once

#include "h2/core/job.hpp"
#include "h2/scheduler/planner.hpp"

#include <memory>

namespace h2::model {
class chip_profiler;
}

namespace h2::runtime {

/// The planner's measurements, taken by profiling each chip kind of `job`
/// (emulated chips: their own charged times; real chips: timed runs of the
/// job's layers). Lazy: only what the planner asks for is measured. Use
/// from one thread.
class profiled_measurements final : public scheduler::chip_measurements {
public:
  /// `job` must outlive this object. `repeats`: timed runs per real-chip
  /// measurement.
  explicit profiled_measurements(const job_config& job, int repeats = 3);
  ~profiled_measurements() override;

  scheduler::layer_timing layer(const chip_spec& chip, layer_kind kind,
                                int micro_batch_size) override;
  double optimizer(const chip_spec& chip, layer_kind kind) override;
  /// A GPU chip's capacity (model::chip_profiler::capacity_bytes).
  std::optional<double> capacity_bytes(const chip_spec& chip) override;

private:
  std::unique_ptr<model::chip_profiler> profiler_;
};

/// Profiles the job's chips and plans it (scheduler::plan_auto). Throws
/// scheduler::infeasible_error (a config_error) when nothing fits.
scheduler::planned plan_job(const job_config& job,
                            const scheduler::planner_options& options = {});

} // namespace h2::runtime
