#include "h2/devices/cuda/context.hpp"

#include "../gpu_checks.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>

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

// -- the device-direct path: dma-buf export ---------------------------------
//
// The driver API is looked up in the loaded libcuda rather than linked: the
// build machines have the toolkit's stub but no driver, and a binary linked
// against libcuda.so.1 would not even start there. RTLD_NOLOAD: a process
// whose tensors live on a GPU has the driver loaded already (cudart loads
// it); one that has not cannot hold device memory to export.

namespace {

struct driver_api {
  decltype(&::cuPointerGetAttribute) pointer_attribute = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuMemGetHandleForAddressRange) range_handle = nullptr;

  bool usable() const noexcept {
    return pointer_attribute != nullptr && device_get != nullptr &&
           device_attribute != nullptr && range_handle != nullptr;
  }
};

/// The driver's entry points once libcuda is loaded; nullptr before. Not
/// found is not remembered: a process may load the driver later (its first
/// CUDA call), and a device pointer must never be taken for host memory.
const driver_api* driver() noexcept {
  static std::atomic<const driver_api*> found{nullptr};
  if (const driver_api* api = found.load(std::memory_order_acquire))
    return api;
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr)
    return nullptr;
  // Kept open, and the table kept, for the process's lifetime.
  static const driver_api api = [lib] {
    driver_api a;
    a.pointer_attribute = reinterpret_cast<decltype(a.pointer_attribute)>(
      ::dlsym(lib, "cuPointerGetAttribute"));
    a.device_get =
      reinterpret_cast<decltype(a.device_get)>(::dlsym(lib, "cuDeviceGet"));
    a.device_attribute = reinterpret_cast<decltype(a.device_attribute)>(
      ::dlsym(lib, "cuDeviceGetAttribute"));
    a.range_handle = reinterpret_cast<decltype(a.range_handle)>(
      ::dlsym(lib, "cuMemGetHandleForAddressRange"));
    return a;
  }();
  if (!api.usable())
    return nullptr;
  found.store(&api, std::memory_order_release);
  return &api;
}

template <class T>
bool pointer_attribute(const driver_api& api, CUpointer_attribute what,
                       const void* ptr, T& out) noexcept {
  return api.pointer_attribute(
           &out, what, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS;
}

} // namespace

std::optional<cuda_allocation> find_cuda_allocation(const void* ptr) noexcept {
  const driver_api* found = driver();
  if (found == nullptr || ptr == nullptr)
    return std::nullopt;
  const driver_api& api = *found;
  unsigned int memory_type = 0;
  if (!pointer_attribute(api, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr,
                         memory_type) ||
      memory_type != CU_MEMORYTYPE_DEVICE)
    return std::nullopt;
  // Managed memory is reachable from the host: it is staged like host
  // memory.
  int managed = 0;
  if (pointer_attribute(api, CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr, managed) &&
      managed != 0)
    return std::nullopt;
  // Range queries through pointer attributes need no current context (the
  // transport's threads may have none).
  CUdeviceptr start = 0;
  std::size_t size = 0;
  unsigned long long id = 0;
  int ordinal = 0;
  if (!pointer_attribute(api, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr,
                         start) ||
      !pointer_attribute(api, CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr, size) ||
      !pointer_attribute(api, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr, id) ||
      !pointer_attribute(api, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr,
                         ordinal))
    return std::nullopt;
  return cuda_allocation{static_cast<std::uintptr_t>(start), size,
                         static_cast<std::uint64_t>(id), ordinal};
}

std::optional<cuda_dmabuf>
export_cuda_dmabuf(const cuda_allocation& a) noexcept {
  const driver_api* found = driver();
  if (found == nullptr || a.bytes == 0)
    return std::nullopt;
  const driver_api& api = *found;
  CUdevice device = 0;
  int supported = 0;
  if (api.device_get(&device, a.device) != CUDA_SUCCESS ||
      api.device_attribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                           device) != CUDA_SUCCESS ||
      supported == 0)
    return std::nullopt;
  // The driver wants the range aligned to host pages; device allocations
  // are (at least) that aligned in practice, so widening stays inside them.
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t base = a.base & ~(page - 1);
  const std::uintptr_t end = (a.base + a.bytes + page - 1) & ~(page - 1);
  int fd = -1;
  if (api.range_handle(&fd, static_cast<CUdeviceptr>(base), end - base,
                       CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                       0) != CUDA_SUCCESS ||
      fd < 0)
    return std::nullopt;
  return cuda_dmabuf{fd, base, end - base};
}

} // namespace h2::devices
