// Backend `cuda:<n>`: an NVIDIA GPU. Compiled when the CUDA toolkit is found
// (H2_WITH_CUDA); usable only where a CUDA device exists and libtorch was
// built with CUDA. Time is measured (after synchronizing), memory is the
// device's own, whose allocator enforces the capacity.
#pragma once

#include "h2/devices/device_context.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>

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

/// The CUDA allocation that holds a pointer, as the RDMA transport needs it
/// to register device memory directly (the device-direct path).
struct cuda_allocation {
  std::uintptr_t base = 0;     ///< start of the allocation
  std::size_t bytes = 0;       ///< its size
  std::uint64_t buffer_id = 0; ///< unique for the process's lifetime
  int device = 0;              ///< device ordinal
};

/// The allocation holding `ptr` when it is CUDA device memory. nullopt for
/// host and managed memory (both reachable from the host), where the process
/// has not loaded the CUDA driver (it is looked up, never loaded: a process
/// whose tensors live on a GPU has it already), or on any driver error.
/// Thread-safe.
std::optional<cuda_allocation> find_cuda_allocation(const void* ptr) noexcept;

/// A dma-buf exported from device memory: `fd` (owned by the caller, who
/// closes it) covers the device addresses [base, base + bytes).
struct cuda_dmabuf {
  int fd = -1;
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
};

/// Exports `a` as a dma-buf (cuMemGetHandleForAddressRange with
/// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD), widened to whole host pages as the
/// driver requires. nullopt when the device does not support dma-buf, the
/// driver is not loaded or refuses (the kernel may lack dma-buf support).
/// Thread-safe.
std::optional<cuda_dmabuf>
export_cuda_dmabuf(const cuda_allocation& a) noexcept;

} // namespace h2::devices
