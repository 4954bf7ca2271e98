// What the GPU backends (cuda/, hip/) check before they hand out a device
// context, written once. Private to devices/.
#pragma once

#include "h2/core/error.hpp"
#include "h2/core/job.hpp"

#include <ATen/Context.h>

#include <cstdint>
#include <optional>
#include <string>

namespace h2::devices::detail {

[[noreturn]] inline void unavailable(const chip_spec& spec,
                                     const std::string& why) {
  throw device_error(device_errc::unavailable, "chip " + spec.id.to_string() +
                                                 " (" + spec.device +
                                                 "): " + why);
}

/// What a GPU chip leaves to everything but its tensors: the CUDA/HIP
/// context, the BLAS workspaces, the caching allocator's fragmentation
/// (docs/ditorch.md, "Memory").
inline constexpr std::uint64_t gpu_memory_reserve_bytes = std::uint64_t{1}
                                                          << 30;

/// The capacity of the GPU `spec` names, after checking that the runtime
/// sees it and that libtorch can compute on it: its free memory now minus
/// gpu_memory_reserve_bytes. `Api` provides:
///   static constexpr const char* name;            // "CUDA"
///   static std::optional<std::string> count(int&); // error text or nullopt
///   static std::optional<std::string> memory(int device, std::uint64_t& free,
///                                            std::uint64_t& total);
/// Throws device_error(unavailable) naming the chip otherwise. A runtime
/// without a driver reports an error from count(): "no device".
template <class Api>
std::uint64_t checked_gpu_capacity(const chip_spec& spec) {
  int count = 0;
  if (auto e = Api::count(count))
    unavailable(spec, std::string("no ") + Api::name + " device (" + *e + ")");
  if (spec.device_index >= count)
    unavailable(spec, "only " + std::to_string(count) + " " + Api::name +
                        " device(s) here");
  // ROCm builds of libtorch answer through hasCUDA() too.
  if (!at::hasCUDA())
    unavailable(spec, std::string("this libtorch was built without ") +
                        Api::name +
                        " support (Debian's libtorch is "
                        "CPU-only)");
  std::uint64_t free = 0, total = 0;
  if (auto e = Api::memory(spec.device_index, free, total))
    unavailable(spec, *e);
  if (free <= gpu_memory_reserve_bytes)
    unavailable(spec, "only " + std::to_string(free >> 20) + " MiB of " +
                        std::to_string(total >> 20) +
                        " MiB free, not more than the 1 GiB reserve");
  return free - gpu_memory_reserve_bytes;
}

} // namespace h2::devices::detail
