// DiTorch: one device interface for every chip (docs/architecture.md, "Device context").
//
// A device_context is owned by one chip actor and used from that actor's
// thread (bind() it there first). It knows what chip it is, where its
// tensors live, how to move them, how much memory it may use, and what time
// it is on the chip. Backends: cpu, emulated:<profile>, cuda:<n>, hip:<n>
// (the last two compiled when their toolkit is found).
#pragma once

#include "h2/core/job.hpp"
#include "h2/devices/chip_clock.hpp"
#include "h2/devices/emulated/cost_function.hpp"
#include "h2/devices/memory.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <exception>

#include <memory>
#include <optional>
#include <string>

namespace h2::devices {

class device_context;

/// What a backend makes current on a thread besides the memory account
/// (a GPU's device and stream); restores the previous state when destroyed.
class current_device {
public:
  virtual ~current_device() = default;
};

/// Makes a device current on the calling thread: its memory account, its
/// intra-op thread count, and on GPUs the device and the chip's stream.
/// Restores the previous state when destroyed.
class thread_binding {
public:
  explicit thread_binding(const device_context& device);
  ~thread_binding();
  thread_binding(const thread_binding&) = delete;
  thread_binding& operator=(const thread_binding&) = delete;

private:
  memory_binding memory_;
  int previous_threads_;
  std::unique_ptr<current_device> current_;
};

/// A chip's memory as its reports show it.
struct memory_usage {
  std::uint64_t used = 0;     ///< bytes held by tensors now
  std::uint64_t peak = 0;     ///< most held since reset_peak()
  std::uint64_t reserved = 0; ///< held by the allocator (GPUs: its cache)
  std::uint64_t capacity = 0; ///< what the chip may use
};

/// Runs the chip's math in its compute dtype for the scope's lifetime:
/// autocast of the chip's device type (CPU or CUDA) to bf16 on bf16 chips,
/// with the GEMMs of bf16_gemm.hpp on host chips whose bf16_path() is
/// fp32_accumulate; nothing on fp32 chips. Open one around every forward
/// pass, including recomputation.
class compute_scope {
public:
  explicit compute_scope(const device_context& device);
  ~compute_scope();
  compute_scope(const compute_scope&) = delete;
  compute_scope& operator=(const compute_scope&) = delete;

private:
  bool active_ = false;
  c10::DeviceType type_ = c10::kCPU;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
  bool previous_fp32_accumulate_ = false;
};

class device_context {
public:
  /// `capacity_bytes` caps the memory account; `threads` is the intra-op
  /// thread count used while bound.
  device_context(const chip_spec& spec, std::uint64_t capacity_bytes,
                 chip_clock clock, int threads);
  virtual ~device_context();

  device_context(const device_context&) = delete;
  device_context& operator=(const device_context&) = delete;

  const chip_spec& spec() const noexcept { return spec_; }
  chip_id id() const noexcept { return spec_.id; }
  const chip_profile& profile() const noexcept { return spec_.profile; }
  dtype compute_dtype() const noexcept { return spec_.compute_dtype; }
  int threads() const noexcept { return threads_; }
  /// How this chip's bf16 GEMMs run: the host's choice (cpu_bf16.hpp) for
  /// chips backed by the host CPU, native on GPUs. Never automatic.
  cpu_bf16 bf16_path() const noexcept { return bf16_path_; }

  /// "0:1 (emulated:mi250x)": how logs and errors name the chip.
  std::string describe() const;

  /// Where this chip's tensors live.
  virtual c10::Device torch_device() const = 0;

  /// Copies (or, for host-memory chips, aliases) a host tensor onto the chip.
  virtual at::Tensor to_device(const at::Tensor& host) const;

  /// A host copy of a chip tensor.
  virtual at::Tensor to_host(const at::Tensor& tensor) const;

  /// Takes over a tensor another chip of this process handed over: on chips
  /// backed by host memory a zero-copy alias charged to this chip's memory
  /// (adopt()), elsewhere a copy onto this chip. Throws
  /// device_error(out_of_memory) when it does not fit.
  virtual at::Tensor take(const at::Tensor& tensor) const;

  /// Makes state another chip has let go of for good (a moved layer's)
  /// this chip's own: charged to this chip alone and shared with nobody.
  /// The same storage where that is this process's host memory, `tensor`
  /// its one holder and this chip backed by host memory (move_charge());
  /// otherwise a copy on this chip, made on the calling thread, which must
  /// be bound to it (a peer's shm block, another device's memory, a storage
  /// someone else still holds). Throws device_error(out_of_memory) when it
  /// does not fit.
  at::Tensor own(const at::Tensor& tensor) const;

  /// Whether `tensor` lives on this chip: on its torch device and, for
  /// chips backed by host memory, charged to its memory account (allocated
  /// with the chip bound, or taken over with take()).
  bool holds(const at::Tensor& tensor) const noexcept;

  /// Waits for the chip's queued work (no-op for CPU-backed chips).
  virtual void synchronize() const {}

  /// What thread_binding makes current besides the memory account (null:
  /// nothing, as on CPU-backed chips).
  virtual std::unique_ptr<current_device> make_current() const {
    return nullptr;
  }

  /// The chip's memory now: the memory account on CPU-backed chips, the
  /// caching allocator's figures on GPUs.
  virtual memory_usage usage() const;

  /// Starts a new peak measurement at the current usage.
  virtual void reset_peak();

  /// The error a libtorch failure on this chip is: device_error
  /// (out_of_memory) for an allocation that did not fit, h2::error naming
  /// the chip otherwise. `failures_before`: memory().failures() before the
  /// failed work.
  virtual std::exception_ptr translate(const c10::Error& e,
                                       std::uint64_t failures_before) const;

  /// Emulated seconds of a layer op; nullopt on real devices, whose ops are
  /// measured instead.
  virtual std::optional<double> layer_seconds(const layer_work& work,
                                              pass p) const;

  /// Emulated seconds of an optimizer update; nullopt on real devices.
  virtual std::optional<double>
  optimizer_seconds(std::int64_t parameters) const;

  /// Seconds to move `bytes` between this chip and a chip of profile `peer`
  /// (emulated link time; 0 on real devices, where the transfer itself
  /// takes the time).
  virtual double transfer_seconds(std::uint64_t bytes,
                                  const chip_profile& peer) const;

  /// Completes an op that began at wall time `wall_start` (clock().wall_now()
  /// then): charges `emulated` seconds, or the measured time when nullopt.
  /// Returns the op's duration in the run's clock (under the wall clock, at
  /// least the emulated time: more when the CPU overran it).
  double complete_op(double wall_start, std::optional<double> emulated);

  memory_account& memory() noexcept { return *memory_; }
  const std::shared_ptr<memory_account>& memory_ptr() const noexcept {
    return memory_;
  }
  chip_clock& clock() noexcept { return clock_; }
  const chip_clock& clock() const noexcept { return clock_; }

private:
  chip_spec spec_;
  std::shared_ptr<memory_account> memory_;
  chip_clock clock_;
  int threads_;
  cpu_bf16 bf16_path_;
};

/// Where the tensors of a chip like `chip` live: cpu for cpu and emulated
/// chips, cuda:<n> for cuda and hip chips (ROCm builds of libtorch name HIP
/// devices "cuda").
c10::Device torch_device_of(const chip_spec& chip);

/// Creates the device context a chip spec asks for, keeping time with
/// `clock`. Throws device_error(unavailable) when its backend was not built
/// or its device does not exist here.
std::unique_ptr<device_context> make_device(const chip_spec& spec,
                                            const emulation_config& emulation,
                                            chip_clock clock, int threads);

/// The host CPU as a chip (`cpu`, computing in `compute`, bf16 GEMMs as
/// `bf16_path` asks): where tools that run the model outside a job compute
/// (h2-export, h2-opcheck's reference).
std::unique_ptr<device_context>
make_host_device(dtype compute = dtype::fp32, int threads = 1,
                 cpu_bf16 bf16_path = cpu_bf16::automatic);

/// The backends compiled into this build, e.g. {"cpu", "emulated", "cuda"}.
std::vector<std::string> built_backends();

} // namespace h2::devices
