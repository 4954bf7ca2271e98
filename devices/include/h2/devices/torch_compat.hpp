// The few libtorch APIs that differ between Debian's libtorch 1.13 (CPU) and
// the libtorch 2.x of the GPU machines. Everything version-dependent lives
// here so the rest of H2 reads the same against both.
#pragma once

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>

#define H2_TORCH_AT_LEAST(major, minor)                                        \
  (TORCH_VERSION_MAJOR > (major) ||                                            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace h2::devices::compat {

/// Enables or disables autocast of device type `type` (CPU or CUDA) with
/// `dtype` on the calling thread.
inline void set_autocast(c10::DeviceType type, bool enabled,
                         at::ScalarType dtype) {
#if H2_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, enabled);
  at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == c10::kCPU) {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

/// The dtype autocast of `type` casts to on the calling thread.
inline at::ScalarType autocast_dtype(c10::DeviceType type) {
#if H2_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(type);
#else
  return type == c10::kCPU ? at::autocast::get_autocast_cpu_dtype()
                           : at::autocast::get_autocast_gpu_dtype();
#endif
}

/// Whether autocast of `type` is on for the calling thread.
inline bool autocast_enabled(c10::DeviceType type) {
#if H2_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type);
#else
  return type == c10::kCPU ? at::autocast::is_cpu_enabled()
                           : at::autocast::is_enabled();
#endif
}

/// Sets up libtorch's CUDA state (its caching allocator among it), as a
/// process's first CUDA tensor would.
inline void init_cuda() {
#if H2_TORCH_AT_LEAST(2, 6)
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#else
  at::globalContext().lazyInitCUDA();
#endif
}

} // namespace h2::devices::compat

// c10::Allocator::allocate lost its const and gained a pure copy_data() in
// libtorch 2.3.
#if H2_TORCH_AT_LEAST(2, 3)
#define H2_ALLOCATE_CONST
#define H2_ALLOCATOR_COPY_DATA                                                 \
  void copy_data(void* dest, const void* src, std::size_t count)               \
    const override {                                                           \
    default_copy_data(dest, src, count);                                       \
  }
#else
#define H2_ALLOCATE_CONST const
#define H2_ALLOCATOR_COPY_DATA
#endif
