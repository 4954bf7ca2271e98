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

#include <memory>
#include <optional>
#include <string>

namespace h2::devices {

class device_context;

/// Makes a device current on the calling thread: its memory account, its
/// intra-op thread count. Restores the previous state when destroyed.
class thread_binding {
public:
  explicit thread_binding(const device_context& device);
  ~thread_binding();
  thread_binding(const thread_binding&) = delete;
  thread_binding& operator=(const thread_binding&) = delete;

private:
  memory_binding memory_;
  int previous_threads_;
};

/// Runs the chip's math in its compute dtype for the scope's lifetime
/// (autocast to bf16 on bf16 chips; nothing on fp32 chips). Open one around
/// every forward pass, including recomputation.
class compute_scope {
public:
  explicit compute_scope(const device_context& device);
  ~compute_scope();
  compute_scope(const compute_scope&) = delete;
  compute_scope& operator=(const compute_scope&) = delete;

private:
  bool active_ = false;
  bool previous_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
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

  /// Waits for the chip's queued work (no-op for CPU-backed chips).
  virtual void synchronize() const {}

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
};

/// Creates the device context a chip spec asks for, keeping time with
/// `clock`. Throws device_error(unavailable) when its backend was not built
/// or its device does not exist here.
std::unique_ptr<device_context> make_device(const chip_spec& spec,
                                            const emulation_config& emulation,
                                            chip_clock clock, int threads);

/// The backends compiled into this build, e.g. {"cpu", "emulated", "cuda"}.
std::vector<std::string> built_backends();

} // namespace h2::devices
