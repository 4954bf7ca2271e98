// Backend `cpu`: the host CPU as a chip. Real math, real (measured) time,
// memory capped at the host's physical memory.
#pragma once

#include "h2/devices/device_context.hpp"

namespace h2::devices {

class cpu_context final : public device_context {
public:
  cpu_context(const chip_spec& spec, chip_clock clock, int threads);

  c10::Device torch_device() const override { return c10::kCPU; }
  at::Tensor to_device(const at::Tensor& host) const override { return host; }
  at::Tensor to_host(const at::Tensor& t) const override { return t; }
};

} // namespace h2::devices
