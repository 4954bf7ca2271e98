// Backend `emulated:<profile>`: real math on the CPU; the time of each
// layer-level op from the profile's roofline cost function; memory capped at
// the profile's capacity x memory_scale; math in the chip's dtype.
#pragma once

#include "h2/devices/device_context.hpp"
#include "h2/devices/emulated/cost_function.hpp"

namespace h2::devices {

class emulated_context final : public device_context {
public:
  emulated_context(const chip_spec& spec, const emulation_config& emulation,
                   chip_clock clock, int threads);

  c10::Device torch_device() const override { return c10::kCPU; }
  at::Tensor to_device(const at::Tensor& host) const override { return host; }
  at::Tensor to_host(const at::Tensor& t) const override { return t; }

  std::optional<double> layer_seconds(const layer_work& work,
                                      pass p) const override;
  std::optional<double>
  optimizer_seconds(std::int64_t parameters) const override;
  double transfer_seconds(std::uint64_t bytes,
                          const chip_profile& peer) const override;

  const emulated_cost_function& cost() const noexcept { return cost_; }

private:
  emulated_cost_function cost_;
  double link_bandwidth_override_; ///< <= 0: none
  double link_latency_override_;   ///< < 0: none
};

} // namespace h2::devices
