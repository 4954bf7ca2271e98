#include "h2/runtime/auto_plan.hpp"

#include "h2/model/profiler.hpp"

namespace h2::runtime {

profiled_measurements::profiled_measurements(const job_config& job, int repeats)
    : profiler_(std::make_unique<model::chip_profiler>(job, repeats)) {
}

profiled_measurements::~profiled_measurements() = default;

scheduler::layer_timing profiled_measurements::layer(const chip_spec& chip,
                                                     layer_kind kind,
                                                     int micro_batch_size) {
  auto p = profiler_->layer(chip, kind, micro_batch_size);
  return {p.forward_seconds, p.backward_seconds, p.input_seconds,
          p.weight_seconds, p.attention_seconds};
}

double profiled_measurements::optimizer(const chip_spec& chip,
                                        layer_kind kind) {
  return profiler_->optimizer(chip, kind);
}

std::optional<double>
profiled_measurements::capacity_bytes(const chip_spec& chip) {
  if (!is_gpu(chip))
    return std::nullopt;
  return static_cast<double>(profiler_->capacity_bytes(chip));
}

scheduler::planned plan_job(const job_config& job,
                            const scheduler::planner_options& options) {
  profiled_measurements m(job);
  return scheduler::plan_auto(job, m, options);
}

} // namespace h2::runtime
