#include "h2/devices/cuda/context.hpp"

#include "../gpu_checks.hpp"

#include "h2/core/error.hpp"
#include "h2/devices/torch_compat.hpp"

#include <h2/config.hpp>

#include <ATen/ops/empty.h>
#if H2_TORCH_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <tuple>

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

  static std::optional<std::string> memory(int device, std::uint64_t& free,
                                           std::uint64_t& total) {
    std::size_t free_bytes = 0, total_bytes = 0;
    cudaError_t rc = cudaSetDevice(device);
    if (rc == cudaSuccess)
      rc = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (rc != cudaSuccess)
      return std::string("cudaMemGetInfo: ") + cudaGetErrorString(rc);
    free = free_bytes;
    total = total_bytes;
    return std::nullopt;
  }
};

} // namespace

struct cuda_context::chip_stream {
#if H2_TORCH_HAS_CUDA
  c10::cuda::CUDAStream stream;
#endif
};

namespace {

#if H2_TORCH_HAS_CUDA
/// The chip's device and stream, current while a thread is bound to it.
class stream_binding final : public current_device {
public:
  explicit stream_binding(const c10::cuda::CUDAStream& s) : guard_(s) {}

private:
  c10::cuda::CUDAStreamGuard guard_;
};
#endif

} // namespace

cuda_context::cuda_context(const chip_spec& spec, chip_clock clock, int threads)
    : device_context(spec, detail::checked_gpu_capacity<cuda_api>(spec),
                     std::move(clock), threads) {
#if H2_TORCH_HAS_CUDA
  // The memory fraction below needs libtorch's allocator set up already.
  compat::init_cuda();
  // A stream of the pool per chip: two chips of one GPU (or a chip and the
  // transport's copies) do not serialise on the default stream.
  stream_ = std::make_unique<chip_stream>(
    chip_stream{c10::cuda::getStreamFromPool(false, torch_device().index())});
  // The capacity is enforced as on every chip: libtorch's allocator may
  // hold no more of the device than it (one chip per GPU and process).
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(spec.device_index) == cudaSuccess &&
      cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess &&
      total_bytes > 0)
    c10::cuda::CUDACachingAllocator::setMemoryFraction(
      std::min(1.0, static_cast<double>(memory_ptr()->capacity_bytes()) /
                      static_cast<double>(total_bytes)),
      torch_device().index());
#endif
}

cuda_context::~cuda_context() = default;

c10::Device cuda_context::torch_device() const {
  return torch_device_of(spec());
}

at::Tensor cuda_context::to_device(const at::Tensor& host) const {
  if (!host.device().is_cpu())
    return host.to(torch_device());
  // Pinned memory lets the copy run asynchronously on the chip's stream;
  // libtorch's host allocator keeps the buffer until the copy is done.
  const auto pinned = host.is_pinned() ? host : host.pin_memory();
  return pinned.to(torch_device(), /*non_blocking=*/true);
}

at::Tensor cuda_context::to_host(const at::Tensor& tensor) const {
  if (tensor.device().is_cpu())
    return tensor;
  const auto source = tensor.detach().contiguous();
  auto host = at::empty(source.sizes(),
                        source.options().device(c10::kCPU).pinned_memory(true));
  host.copy_(source); // blocking: waits for the chip's stream
  return host;
}

at::Tensor cuda_context::take(const at::Tensor& tensor) const {
  if (!tensor.defined() || tensor.device() == torch_device())
    return tensor;
  return to_device(tensor);
}

void cuda_context::synchronize() const {
#if H2_TORCH_HAS_CUDA
  stream_->stream.synchronize();
#else
  cudaSetDevice(spec().device_index);
  cudaDeviceSynchronize();
#endif
}

std::unique_ptr<current_device> cuda_context::make_current() const {
#if H2_TORCH_HAS_CUDA
  return std::make_unique<stream_binding>(stream_->stream);
#else
  return nullptr;
#endif
}

memory_usage cuda_context::usage() const {
#if H2_TORCH_HAS_CUDA
  // Index 0 of each stat array is the aggregate over pool kinds (StatType::
  // AGGREGATE in every libtorch version).
  const auto stats =
    c10::cuda::CUDACachingAllocator::getDeviceStats(torch_device().index());
  const auto& allocated = stats.allocated_bytes[0];
  const auto& reserved = stats.reserved_bytes[0];
  return {static_cast<std::uint64_t>(allocated.current),
          static_cast<std::uint64_t>(allocated.peak),
          static_cast<std::uint64_t>(reserved.current),
          memory_ptr()->capacity_bytes()};
#else
  return device_context::usage();
#endif
}

void cuda_context::reset_peak() {
#if H2_TORCH_HAS_CUDA
  c10::cuda::CUDACachingAllocator::resetPeakStats(torch_device().index());
#else
  device_context::reset_peak();
#endif
}

std::exception_ptr
cuda_context::translate(const c10::Error& e,
                        std::uint64_t failures_before) const {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) == nullptr)
    return device_context::translate(e, failures_before);
  std::string what = e.what_without_backtrace();
  return std::make_exception_ptr(device_error(
    device_errc::out_of_memory,
    "chip " + describe() +
      " is out of device memory: " + what.substr(0, what.find('\n'))));
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
  decltype(&::cuCtxGetCurrent) current_context = nullptr;

  bool usable() const noexcept {
    return pointer_attribute != nullptr && device_get != nullptr &&
           device_attribute != nullptr && range_handle != nullptr &&
           current_context != nullptr;
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
    a.current_context = reinterpret_cast<decltype(a.current_context)>(
      ::dlsym(lib, "cuCtxGetCurrent"));
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

// -- CUDA IPC ----------------------------------------------------------------

namespace {

/// The calling thread's current device, restored when the guard goes: the
/// transport's copies run on stage threads bound to their own chip. A
/// thread without a current context is left on the device used (restoring
/// "device 0" would create a context there).
class device_restorer {
public:
  device_restorer() noexcept {
    const driver_api* api = driver();
    CUcontext current = nullptr;
    if (api == nullptr || api->current_context(&current) != CUDA_SUCCESS ||
        current == nullptr || cudaGetDevice(&previous_) != cudaSuccess)
      previous_ = -1;
  }
  ~device_restorer() {
    if (previous_ >= 0)
      cudaSetDevice(previous_);
  }
  device_restorer(const device_restorer&) = delete;
  device_restorer& operator=(const device_restorer&) = delete;

private:
  int previous_ = -1;
};

std::string cuda_failure(const char* call, cudaError_t rc) {
  return std::string(call) + ": " + cudaGetErrorString(rc);
}

} // namespace

cuda_shared_memory::cuda_shared_memory(int device, std::size_t bytes)
    : bytes_(bytes), device_(device) {
  device_restorer restore;
  auto fail = [&](const char* call, cudaError_t rc) {
    cudaGetLastError(); // clears a sticky allocation error
    throw device_error(rc == cudaErrorMemoryAllocation
                         ? device_errc::out_of_memory
                         : device_errc::unavailable,
                       "sharing " + std::to_string(bytes) +
                         " bytes of cuda:" + std::to_string(device) +
                         " with another process: " + cuda_failure(call, rc));
  };
  cudaError_t rc = cudaSetDevice(device);
  if (rc != cudaSuccess)
    fail("cudaSetDevice", rc);
  char bus_id[32] = {};
  rc = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device);
  if (rc != cudaSuccess)
    fail("cudaDeviceGetPCIBusId", rc);
  pci_bus_id_ = bus_id;
  rc = cudaMalloc(&data_, bytes);
  if (rc != cudaSuccess)
    fail("cudaMalloc", rc);
  cudaIpcMemHandle_t handle;
  rc = cudaIpcGetMemHandle(&handle, data_);
  if (rc != cudaSuccess) {
    cudaFree(data_);
    fail("cudaIpcGetMemHandle", rc);
  }
  static_assert(sizeof(handle) == std::tuple_size_v<cuda_ipc_handle>);
  std::memcpy(handle_.data(), &handle, sizeof(handle));
}

cuda_shared_memory::~cuda_shared_memory() {
  device_restorer restore;
  if (cudaSetDevice(device_) == cudaSuccess)
    cudaFree(data_);
}

cuda_mapped_memory::cuda_mapped_memory(const cuda_ipc_handle& handle,
                                       const std::string& pci_bus_id,
                                       int device) {
  device_restorer restore;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  // On `on`: its context opens the handle, enabling peer access to the GPU
  // the memory lives on when that is another.
  auto open_on = [&](int on) -> std::optional<std::string> {
    cudaError_t rc = cudaSetDevice(on);
    if (rc == cudaSuccess)
      rc = cudaIpcOpenMemHandle(&data_, h, cudaIpcMemLazyEnablePeerAccess);
    if (rc == cudaSuccess) {
      device_ = on;
      return std::nullopt;
    }
    cudaGetLastError();
    return "cuda:" + std::to_string(on) + ": " +
           cuda_failure("cudaIpcOpenMemHandle", rc);
  };
  std::string why;
  if (device >= 0) {
    auto failed = open_on(device);
    if (!failed) {
      record_size();
      return;
    }
    why = *failed + "; ";
  }
  int home = -1;
  cudaError_t rc = cudaDeviceGetByPCIBusId(&home, pci_bus_id.c_str());
  if (rc != cudaSuccess) {
    cudaGetLastError();
    why += cuda_failure("cudaDeviceGetByPCIBusId (is the GPU visible to this "
                        "process? CUDA_VISIBLE_DEVICES)",
                        rc);
  } else if (home != device) {
    auto failed = open_on(home);
    if (!failed) {
      record_size();
      return;
    }
    why += *failed;
  }
  throw device_error(device_errc::unavailable,
                     "mapping the device memory of GPU " + pci_bus_id +
                       " that another process shared: " + why);
}

void cuda_mapped_memory::record_size() noexcept {
  if (auto a = find_cuda_allocation(data_))
    bytes_ = a->bytes;
}

cuda_mapped_memory::~cuda_mapped_memory() {
  device_restorer restore;
  if (cudaSetDevice(device_) == cudaSuccess)
    cudaIpcCloseMemHandle(data_);
}

namespace {

/// Makes `device` current and waits for all its queued work; `call` names
/// the CUDA call that failed.
cudaError_t select_and_wait(int device, const char*& call) {
  call = "cudaSetDevice";
  cudaError_t rc = cudaSetDevice(device);
  if (rc == cudaSuccess) {
    call = "cudaDeviceSynchronize";
    rc = cudaDeviceSynchronize();
  }
  return rc;
}

} // namespace

void synchronize_cuda_device(int device) {
  device_restorer restore;
  const char* call = nullptr;
  if (const cudaError_t rc = select_and_wait(device, call); rc != cudaSuccess) {
    cudaGetLastError();
    throw device_error(device_errc::invalid,
                       "waiting for cuda:" + std::to_string(device) + ": " +
                         cuda_failure(call, rc));
  }
}

void copy_device_memory(void* dst, const void* src, std::size_t bytes,
                        int device) {
  device_restorer restore;
  // The legacy default stream does not wait for libtorch's streams (they
  // are non-blocking): the whole device is waited for, before and after.
  const char* call = nullptr;
  cudaError_t rc = select_and_wait(device, call);
  if (rc == cudaSuccess) {
    call = "cudaMemcpy";
    rc = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  }
  if (rc == cudaSuccess) {
    call = "cudaDeviceSynchronize";
    rc = cudaDeviceSynchronize();
  }
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw device_error(
      device_errc::invalid,
      "copying " + std::to_string(bytes) + " bytes of device memory on cuda:" +
        std::to_string(device) + ": " + cuda_failure(call, rc));
  }
}

} // namespace h2::devices
