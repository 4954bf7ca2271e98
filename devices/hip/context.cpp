#include "h2/devices/hip/context.hpp"

#include <ATen/Context.h>
#include <hip/hip_runtime_api.h>

namespace h2::devices {

namespace {

[[noreturn]] void unavailable(const chip_spec& spec, const std::string& why) {
  throw device_error(device_errc::unavailable,
                     "chip " + spec.id.to_string() + " (" + spec.device +
                       "): " + why);
}

std::uint64_t checked_capacity(const chip_spec& spec) {
  int count = 0;
  hipError_t rc = hipGetDeviceCount(&count);
  if (rc != hipSuccess)
    unavailable(spec, std::string("no HIP device (hipGetDeviceCount: ") +
                        hipGetErrorString(rc) + ")");
  if (spec.device_index >= count)
    unavailable(spec, "only " + std::to_string(count) + " HIP device(s)");
  if (!at::hasCUDA()) // ROCm builds of libtorch answer through hasCUDA()
    unavailable(spec, "this libtorch was built without ROCm");
  (void)hipSetDevice(spec.device_index);
  std::size_t free_bytes = 0, total_bytes = 0;
  rc = hipMemGetInfo(&free_bytes, &total_bytes);
  if (rc != hipSuccess)
    unavailable(spec, std::string("hipMemGetInfo: ") + hipGetErrorString(rc));
  return total_bytes;
}

} // namespace

hip_context::hip_context(const chip_spec& spec,
                         chip_clock::wall_clock::time_point origin,
                         int threads, clock_mode clock)
  : device_context(spec, checked_capacity(spec), chip_clock(clock, origin),
                   threads) {
}

c10::Device hip_context::torch_device() const {
  return c10::Device(c10::kCUDA,
                     static_cast<c10::DeviceIndex>(spec().device_index));
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
