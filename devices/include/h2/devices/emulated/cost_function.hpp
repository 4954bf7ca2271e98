// The emulated chip's own roofline cost function (docs/architecture.md): how long a
// layer-level op takes on a chip of a given profile. Deliberately NOT the
// planner's cost model (scheduler/): the planner learns chips by profiling
// them, as it would real ones.
#pragma once

#include "h2/core/model_config.hpp"
#include "h2/core/profile.hpp"

#include <cstdint>

namespace h2::devices {

/// The pass of a layer-level op.
enum class pass {
  forward,
  backward,        ///< fused: input and weight gradients
  backward_input,  ///< B of a split backward: the input gradients
  backward_weight, ///< W of a split backward: the weight gradients
};

/// time = overhead x overhead_scale
///        + max(flops / (peak(dtype) x efficiency(rows)),
///              bytes / memory bandwidth)
/// B and W take their share of the backward's FLOPs and bytes
/// (weight_gradient_share()) and each pays the per-op overhead: a split
/// backward launches its kernels in two ops.
/// efficiency(rows) = max_efficiency x rows / (rows + half_efficiency_rows),
/// all multiplied by `time_scale`. `overhead_scale` scales the fixed costs
/// (per-op overhead, link latency) alone: a small stand-in model would
/// otherwise be launch-bound on every chip (docs/emulation.md).
class emulated_cost_function {
public:
  emulated_cost_function(const chip_profile& profile, dtype compute_dtype,
                         double time_scale, double overhead_scale = 1.0);

  /// Seconds of one layer's forward or backward on one micro-batch.
  double layer_seconds(const layer_work& work, pass p) const noexcept;

  /// Seconds of the AdamW update of `parameters` fp32 parameters (reads
  /// parameter, gradient and both moments, writes three of them).
  double optimizer_seconds(std::int64_t parameters) const noexcept;

  /// Seconds to move `bytes` to a chip whose interconnect is
  /// `peer_bytes_per_second`: the slower end's bandwidth plus the latency
  /// (both overridable for every link).
  double transfer_seconds(std::uint64_t bytes, double peer_bytes_per_second,
                          double bandwidth_override,
                          double latency_override) const noexcept;

  const chip_profile& profile() const noexcept { return profile_; }

private:
  chip_profile profile_;
  dtype dtype_;
  double time_scale_;
  double overhead_scale_;
};

} // namespace h2::devices
