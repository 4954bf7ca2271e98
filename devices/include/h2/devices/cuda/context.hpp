// Backend `cuda:<n>`: an NVIDIA GPU. Compiled when the CUDA toolkit is found
// (H2_WITH_CUDA); usable only where a CUDA device exists and libtorch was
// built with CUDA (H2_TORCH_HAS_CUDA: the stream, memory figures and
// out-of-memory errors below need libtorch's c10/cuda). Time is measured
// (after synchronizing); memory is the device's own, read from libtorch's
// caching allocator (docs/ditorch.md).
#pragma once

#include "h2/devices/device_context.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace h2::devices {

class cuda_context final : public device_context {
public:
  /// Throws device_error(unavailable) when no such device exists or libtorch
  /// lacks CUDA.
  cuda_context(const chip_spec& spec, chip_clock clock, int threads);
  ~cuda_context() override;

  c10::Device torch_device() const override;
  /// Host to device through a pinned buffer, on the chip's stream; call
  /// with the chip bound (thread_binding).
  at::Tensor to_device(const at::Tensor& host) const override;
  /// Device to a pinned host buffer, waiting for the copy; call with the
  /// chip bound.
  at::Tensor to_host(const at::Tensor& tensor) const override;
  /// A tensor of this device as it is; others copied onto it.
  at::Tensor take(const at::Tensor& tensor) const override;
  void synchronize() const override;
  /// The device and the chip's own stream.
  std::unique_ptr<current_device> make_current() const override;
  /// Allocated (used, peak) and reserved bytes of libtorch's caching
  /// allocator on this device; the capacity is the free memory at start
  /// minus the reserve.
  memory_usage usage() const override;
  void reset_peak() override;
  /// libtorch's OutOfMemoryError is device_error(out_of_memory) naming the
  /// chip.
  std::exception_ptr translate(const c10::Error& e,
                               std::uint64_t failures_before) const override;

  /// Number of CUDA devices visible here (0 when the driver reports none or
  /// fails: no driver is "no device").
  static int device_count() noexcept;

private:
  struct chip_stream;
  std::unique_ptr<chip_stream> stream_; ///< null without H2_TORCH_HAS_CUDA
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

// -- CUDA IPC: device memory shared with another process of this host (the
// shm channels between CUDA chips; docs/transport.md, "Device memory").

/// The bytes of a cudaIpcMemHandle_t.
using cuda_ipc_handle = std::array<std::byte, 64>;

/// Device memory of this process that other processes of this host may map:
/// a cudaMalloc outside libtorch's caching allocator (an exported allocation
/// must never be handed to another tensor), freed with the object.
class cuda_shared_memory {
public:
  /// `bytes` on device `device`, exported. Throws device_error:
  /// out_of_memory, or unavailable naming the CUDA error (no such device,
  /// no driver, IPC not supported).
  cuda_shared_memory(int device, std::size_t bytes);
  ~cuda_shared_memory();
  cuda_shared_memory(const cuda_shared_memory&) = delete;
  cuda_shared_memory& operator=(const cuda_shared_memory&) = delete;

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return bytes_; }
  int device() const noexcept { return device_; }
  const cuda_ipc_handle& handle() const noexcept { return handle_; }
  /// The device's PCI bus id ("0000:3b:00.0"): how the peer finds the
  /// device whatever its own device numbering (CUDA_VISIBLE_DEVICES).
  const std::string& pci_bus_id() const noexcept { return pci_bus_id_; }

private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
  cuda_ipc_handle handle_{};
  std::string pci_bus_id_;
};

/// Another process's cuda_shared_memory, mapped into this one until the
/// object goes.
class cuda_mapped_memory {
public:
  /// Maps `handle`, shared from the GPU at `pci_bus_id`, on device
  /// `device` (this process's ordinal; peer access is enabled when that is
  /// another GPU), else on the GPU it lives on when that is visible here.
  /// `device` -1: on that GPU only. Throws device_error(unavailable) when
  /// neither works, naming the CUDA errors.
  cuda_mapped_memory(const cuda_ipc_handle& handle,
                     const std::string& pci_bus_id, int device = -1);
  ~cuda_mapped_memory();
  cuda_mapped_memory(const cuda_mapped_memory&) = delete;
  cuda_mapped_memory& operator=(const cuda_mapped_memory&) = delete;

  void* data() const noexcept { return data_; }
  /// The device's ordinal in this process.
  int device() const noexcept { return device_; }
  /// Bytes the exporter allocated, as the driver tells (0: it did not).
  std::size_t size() const noexcept { return bytes_; }

private:
  /// size() from the driver, once mapped.
  void record_size() noexcept;

  void* data_ = nullptr;
  int device_ = 0;
  std::size_t bytes_ = 0;
};

/// Returns once every stream of device `device` has finished its work (a
/// NIC is about to read what kernels wrote). The calling thread's current
/// device is left as it was. Throws device_error(invalid) naming the CUDA
/// error.
void synchronize_cuda_device(int device);

/// Copies `bytes` from `src` to `dst`, device memory that device `device`
/// reaches, once every stream of the device has finished its work (the
/// copy reads what kernels wrote and may write where kernels read), and
/// returns when the copy is done. The calling thread's current device is
/// left as it was. Throws device_error(invalid) naming the CUDA error.
void copy_device_memory(void* dst, const void* src, std::size_t bytes,
                        int device);

} // namespace h2::devices
