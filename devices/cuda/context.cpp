#include "h2/devices/cuda/context.hpp"

#include <ATen/Context.h>
#include <cuda_runtime_api.h>

namespace h2::devices {

namespace {

[[noreturn]] void unavailable(const chip_spec& spec, const std::string& why) {
  throw device_error(device_errc::unavailable,
                     "chip " + spec.id.to_string() + " (" + spec.device +
                       "): " + why);
}

std::uint64_t checked_capacity(const chip_spec& spec) {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess)
    unavailable(spec, std::string("no CUDA device (cudaGetDeviceCount: ") +
                        cudaGetErrorString(rc) + ")");
  if (spec.device_index >= count)
    unavailable(spec, "only " + std::to_string(count) + " CUDA device(s)");
  if (!at::hasCUDA())
    unavailable(spec, "this libtorch was built without CUDA (Debian's "
                      "libtorch is CPU-only; build against a CUDA libtorch)");
  cudaSetDevice(spec.device_index);
  std::size_t free_bytes = 0, total_bytes = 0;
  rc = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (rc != cudaSuccess)
    unavailable(spec, std::string("cudaMemGetInfo: ") + cudaGetErrorString(rc));
  return total_bytes;
}

} // namespace

cuda_context::cuda_context(const chip_spec& spec,
                           chip_clock::wall_clock::time_point origin,
                           int threads, clock_mode clock)
  : device_context(spec, checked_capacity(spec), chip_clock(clock, origin),
                   threads) {
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
