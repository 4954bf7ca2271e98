#include "h2/devices/cuda/context.hpp"

#include "../gpu_checks.hpp"

#include <cuda_runtime_api.h>

namespace h2::devices {

namespace {

struct cuda_api {
  static constexpr const char* name = "CUDA";

  static std::optional<std::string> count(int& n) {
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess)
      return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
    return std::nullopt;
  }

  static std::optional<std::string> total_memory(int device,
                                                 std::uint64_t& total) {
    std::size_t free_bytes = 0, total_bytes = 0;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
      rc = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (rc != cudaSuccess)
      return std::string("cudaMemGetInfo: ") + cudaGetErrorString(rc);
    total = total_bytes;
    return std::nullopt;
  }
};

} // namespace

cuda_context::cuda_context(const chip_spec& spec, chip_clock clock, int threads)
    : device_context(spec, detail::checked_gpu_capacity<cuda_api>(spec),
                     std::move(clock), threads) {
}

c10::Device cuda_context::torch_device() const {
  return c10::Device(c10::kCUDA,
                     static_cast<c10::DeviceIndex>(spec().device_index));
}

void cuda_context::synchronize() const {
  cudaSetDevice(spec().device_index);
  cudaDeviceSynchronize();
}

int cuda_context::device_count() noexcept {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

} // namespace h2::devices
