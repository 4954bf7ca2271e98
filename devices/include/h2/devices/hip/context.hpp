// Backend `hip:<n>`: an AMD GPU through ROCm's HIP runtime. Compiled when the
// HIP runtime is found (H2_WITH_HIP); usable only where a HIP device exists
// and libtorch was built for ROCm (which names HIP devices "cuda").
#pragma once

#include "h2/devices/device_context.hpp"

namespace h2::devices {

class hip_context final : public device_context {
public:
  /// Throws device_error(unavailable) when no such device exists or libtorch
  /// lacks ROCm.
  hip_context(const chip_spec& spec, chip_clock clock, int threads);

  c10::Device torch_device() const override;
  void synchronize() const override;

  /// Number of HIP devices visible here (0 when none or on any error).
  static int device_count() noexcept;
};

} // namespace h2::devices
