// Backend `cuda:<n>`: an NVIDIA GPU. Compiled when the CUDA toolkit is found
// (H2_WITH_CUDA); usable only where a CUDA device exists and libtorch was
// built with CUDA. Time is measured (after synchronizing), memory is the
// device's own, whose allocator enforces the capacity.
#pragma once

#include "h2/devices/device_context.hpp"

namespace h2::devices {

class cuda_context final : public device_context {
public:
  /// Throws device_error(unavailable) when no such device exists or libtorch
  /// lacks CUDA.
  cuda_context(const chip_spec& spec, chip_clock clock, int threads);

  c10::Device torch_device() const override;
  void synchronize() const override;

  /// Number of CUDA devices visible here (0 when the driver reports none or
  /// fails: no driver is "no device").
  static int device_count() noexcept;
};

} // namespace h2::devices
