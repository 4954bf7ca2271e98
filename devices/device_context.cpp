#include "h2/devices/device_context.hpp"

#include "gpu_checks.hpp"
#include "h2/devices/bf16_gemm.hpp"
#include "h2/devices/cpu/context.hpp"
#include "h2/devices/cpu_bf16.hpp"
#include "h2/devices/emulated/context.hpp"
#include "h2/devices/torch_compat.hpp"

#include <h2/config.hpp>
#if H2_HAS_CUDA
#include "h2/devices/cuda/context.hpp"
#endif
#if H2_HAS_HIP
#include "h2/devices/hip/context.hpp"
#endif

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

namespace h2::devices {

thread_binding::thread_binding(const device_context& device)
    : memory_(device.memory_ptr()),
      previous_threads_(at::get_num_threads()),
      current_(device.make_current()) {
  // OpenMP's thread count is per thread: set it on the chip's own thread.
  at::set_num_threads(device.threads());
}

thread_binding::~thread_binding() {
  at::set_num_threads(previous_threads_);
}

compute_scope::compute_scope(const device_context& device)
    : type_(device.torch_device().type()) {
  if (device.compute_dtype() == dtype::fp32 ||
      (type_ != c10::kCPU && type_ != c10::kCUDA))
    return;
  active_ = true;
  previous_enabled_ = compat::autocast_enabled(type_);
  previous_dtype_ = compat::autocast_dtype(type_);
  at::autocast::increment_nesting();
  compat::set_autocast(type_, true,
                       device.compute_dtype() == dtype::bf16 ? at::kBFloat16
                                                             : at::kHalf);
  previous_fp32_accumulate_ = bf16_gemm::set_active(
    type_ == c10::kCPU && device.compute_dtype() == dtype::bf16 &&
    device.bf16_path() == cpu_bf16::fp32_accumulate);
}

compute_scope::~compute_scope() {
  if (!active_)
    return;
  bf16_gemm::set_active(previous_fp32_accumulate_);
  compat::set_autocast(type_, previous_enabled_, previous_dtype_);
  // Autocast caches cast weights; drop them so the next step sees the
  // optimizer's update (what torch.autocast's __exit__ does).
  if (at::autocast::decrement_nesting() == 0)
    at::autocast::clear_cache();
}

device_context::device_context(const chip_spec& spec,
                               std::uint64_t capacity_bytes, chip_clock clock,
                               int threads)
    : spec_(spec),
      memory_(std::make_shared<memory_account>(
        spec.id.to_string() + " (" + spec.device + ")", capacity_bytes)),
      clock_(clock),
      threads_(threads),
      bf16_path_(is_gpu(spec) ? cpu_bf16::native
                              : host_cpu_bf16(spec.bf16_path).path) {
}

device_context::~device_context() = default;

std::string device_context::describe() const {
  return spec_.id.to_string() + " (" + spec_.device + ")";
}

at::Tensor device_context::to_device(const at::Tensor& host) const {
  return host.to(torch_device());
}

at::Tensor device_context::to_host(const at::Tensor& tensor) const {
  return tensor.to(c10::kCPU);
}

at::Tensor device_context::take(const at::Tensor& tensor) const {
  if (tensor.device() == torch_device())
    return adopt(tensor, memory_);
  return tensor.to(torch_device());
}

at::Tensor device_context::own(const at::Tensor& tensor) const {
  if (!tensor.defined())
    return tensor;
  if (tensor.device() == torch_device() && tensor.is_cpu() &&
      move_charge(tensor, memory_))
    return tensor;
  auto out = at::empty(tensor.sizes(), tensor.options().device(torch_device()));
  out.copy_(tensor);
  return out;
}

bool device_context::holds(const at::Tensor& tensor) const noexcept {
  if (!tensor.defined() || tensor.device() != torch_device())
    return false;
  return !tensor.device().is_cpu() || charged_account(tensor) == memory_.get();
}

memory_usage device_context::usage() const {
  const auto& m = *memory_;
  return {m.used_bytes(), m.peak_bytes(), m.used_bytes(), m.capacity_bytes()};
}

void device_context::reset_peak() {
  memory_->reset_peak();
}

std::exception_ptr
device_context::translate(const c10::Error& e,
                          std::uint64_t failures_before) const {
  // An out-of-memory raised inside an op may reach us wrapped by libtorch.
  if (memory_->failures() != failures_before)
    return std::make_exception_ptr(
      device_error(device_errc::out_of_memory, memory_->last_failure()));
  std::string what = e.what_without_backtrace();
  return std::make_exception_ptr(h2::error(
    "chip " + describe() + ": libtorch: " + what.substr(0, what.find('\n'))));
}

std::optional<double> device_context::layer_seconds(const layer_work&,
                                                    pass) const {
  return std::nullopt;
}

std::optional<double> device_context::optimizer_seconds(std::int64_t) const {
  return std::nullopt;
}

double device_context::transfer_seconds(std::uint64_t,
                                        const chip_profile&) const {
  return 0;
}

double device_context::complete_op(double wall_start,
                                   std::optional<double> emulated) {
  double seconds = emulated ? *emulated : clock_.wall_now() - wall_start;
  clock_.complete_op(wall_start, seconds);
  // Under the wall clock an overrun makes the op longer than emulated.
  return clock_.mode() == clock_mode::wall ? clock_.wall_now() - wall_start
                                           : seconds;
}

c10::Device torch_device_of(const chip_spec& chip) {
  if (!is_gpu(chip))
    return c10::kCPU;
  return {c10::kCUDA, static_cast<c10::DeviceIndex>(chip.device_index)};
}

std::unique_ptr<device_context> make_device(const chip_spec& spec,
                                            const emulation_config& emulation,
                                            chip_clock clock, int threads) {
  switch (spec.backend) {
    case device_backend::cpu:
      return std::make_unique<cpu_context>(spec, std::move(clock), threads);
    case device_backend::emulated:
      return std::make_unique<emulated_context>(spec, emulation,
                                                std::move(clock), threads);
    case device_backend::cuda:
#if H2_HAS_CUDA
      return std::make_unique<cuda_context>(spec, std::move(clock), threads);
#else
      detail::unavailable(spec, "this build has no CUDA backend (configure "
                                "with H2_WITH_CUDA=ON where the CUDA toolkit "
                                "is installed)");
#endif
    case device_backend::hip:
#if H2_HAS_HIP
      return std::make_unique<hip_context>(spec, std::move(clock), threads);
#else
      detail::unavailable(spec, "this build has no HIP backend (configure "
                                "with H2_WITH_HIP=ON where ROCm's HIP runtime "
                                "is installed)");
#endif
  }
  throw internal_error("unknown device backend");
}

std::unique_ptr<device_context> make_host_device(dtype compute, int threads,
                                                 cpu_bf16 bf16_path) {
  chip_spec host = chip_of_device("cpu", "", catalog::builtin());
  host.compute_dtype = compute;
  host.bf16_path = bf16_path;
  return std::make_unique<cpu_context>(
    host, chip_clock(clock_mode::virtual_clock, chip_clock::wall_clock::now()),
    threads);
}

std::vector<std::string> built_backends() {
  std::vector<std::string> out{"cpu", "emulated"};
#if H2_HAS_CUDA
  out.push_back("cuda");
#endif
#if H2_HAS_HIP
  out.push_back("hip");
#endif
  return out;
}

} // namespace h2::devices
