#include "h2/devices/emulated/cost_function.hpp"

#include <algorithm>
#include <cmath>

namespace h2::devices {

emulated_cost_function::emulated_cost_function(const chip_profile& profile,
                                               dtype compute_dtype,
                                               double time_scale,
                                               double overhead_scale)
    : profile_(profile),
      dtype_(compute_dtype),
      time_scale_(time_scale),
      overhead_scale_(overhead_scale) {
}

double emulated_cost_function::layer_seconds(const layer_work& work,
                                             pass p) const noexcept {
  const auto& em = profile_.emulation;
  double flops = 0, bytes = 0;
  const double weight_share = weight_gradient_share(work);
  switch (p) {
    case pass::forward:
      flops = work.forward_flops;
      bytes = work.forward_bytes;
      break;
    case pass::backward:
      flops = work.backward_flops;
      bytes = work.backward_bytes;
      break;
    case pass::backward_input:
      flops = work.backward_flops - work.weight_gradient_flops;
      bytes = work.backward_bytes * (1 - weight_share);
      break;
    case pass::backward_weight:
      flops = work.weight_gradient_flops;
      bytes = work.backward_bytes * weight_share;
      break;
  }
  double efficiency =
    em.max_efficiency * work.rows / (work.rows + em.half_efficiency_rows);
  double compute = flops / (profile_.peak_flops(dtype_) * efficiency);
  double memory = bytes / profile_.memory_bandwidth_bytes_per_second;
  return time_scale_ *
         (em.op_overhead_seconds * overhead_scale_ + std::max(compute, memory));
}

double emulated_cost_function::optimizer_seconds(
  std::int64_t parameters) const noexcept {
  // fp32 master weights: read p, g, m, v; write p, m, v.
  double bytes = 7.0 * 4.0 * static_cast<double>(parameters);
  return time_scale_ *
         (profile_.emulation.op_overhead_seconds * overhead_scale_ +
          bytes / profile_.memory_bandwidth_bytes_per_second);
}

double emulated_cost_function::transfer_seconds(
  std::uint64_t bytes, double peer_bytes_per_second, double bandwidth_override,
  double latency_override) const noexcept {
  double bandwidth =
    bandwidth_override > 0
      ? bandwidth_override
      : std::min(profile_.interconnect_bytes_per_second, peer_bytes_per_second);
  double latency =
    latency_override >= 0
      ? latency_override
      : profile_.emulation.link_latency_seconds * overhead_scale_;
  double wire =
    std::isinf(bandwidth) ? 0.0 : static_cast<double>(bytes) / bandwidth;
  return time_scale_ * (latency + wire);
}

} // namespace h2::devices
