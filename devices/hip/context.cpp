#include "h2/devices/hip/context.hpp"

#include "../gpu_checks.hpp"

#include <hip/hip_runtime_api.h>

namespace h2::devices {

namespace {

struct hip_api {
  static constexpr const char* name = "HIP";

  static std::optional<std::string> count(int& n) {
    hipError_t rc = hipGetDeviceCount(&n);
    if (rc != hipSuccess)
      return std::string("hipGetDeviceCount: ") + hipGetErrorString(rc);
    return std::nullopt;
  }

  static std::optional<std::string> memory(int device, std::uint64_t& free,
                                           std::uint64_t& total) {
    std::size_t free_bytes = 0, total_bytes = 0;
    hipError_t rc = hipSetDevice(device);
    if (rc == hipSuccess)
      rc = hipMemGetInfo(&free_bytes, &total_bytes);
    if (rc != hipSuccess)
      return std::string("hipMemGetInfo: ") + hipGetErrorString(rc);
    free = free_bytes;
    total = total_bytes;
    return std::nullopt;
  }
};

} // namespace

hip_context::hip_context(const chip_spec& spec, chip_clock clock, int threads)
    : device_context(spec, detail::checked_gpu_capacity<hip_api>(spec),
                     std::move(clock), threads) {
}

c10::Device hip_context::torch_device() const {
  return torch_device_of(spec());
}

void hip_context::synchronize() const {
  (void)hipSetDevice(spec().device_index);
  (void)hipDeviceSynchronize();
}

int hip_context::device_count() noexcept {
  int count = 0;
  return hipGetDeviceCount(&count) == hipSuccess ? count : 0;
}

} // namespace h2::devices
