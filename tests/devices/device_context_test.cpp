#include "h2/devices/device_context.hpp"

#include "h2/devices/cpu/context.hpp"
#include "h2/devices/emulated/context.hpp"

#include <h2/config.hpp>
#if H2_HAS_CUDA
#include "h2/devices/cuda/context.hpp"
#endif
#if H2_HAS_HIP
#include "h2/devices/hip/context.hpp"
#endif

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include "test_jobs.hpp"
#include "expect_contains.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

namespace h2::devices {
namespace {

/// A small job: a CPU, an emulated bf16 A100 and an emulated fp32 H100.
const job_config& job() {
  static const job_config j = parse_job(test::model_toml(17, 8, 16, 2, 2) + R"(
[train]
global_batch = 4
[emulation]
memory_scale = 0.001
time_scale = 2
[[nodes]]
chips = ["cpu", "emulated:a100-sxm-40gb",
         { device = "emulated:h100-sxm", dtype = "fp32" }]
)",
                                        "devices_test.toml");
  return j;
}

const chip_spec& chip(int index) {
  const chip_spec* c = job().find_chip(chip_id{0, index});
  EXPECT_NE(c, nullptr);
  return *c;
}

std::unique_ptr<device_context> make(const chip_spec& spec,
                                     const emulation_config& em) {
  return make_device(spec, em,
                     chip_clock(em.clock, chip_clock::wall_clock::now()), 1);
}

std::unique_ptr<device_context> make(int index) {
  return make(chip(index), job().emulation);
}

using test::expect_contains;

TEST(devices_context, cpu_device) {
  auto d = make(0);
  EXPECT_NE(dynamic_cast<cpu_context*>(d.get()), nullptr);
  EXPECT_EQ(d->id(), (chip_id{0, 0}));
  EXPECT_EQ(d->describe(), "0:0 (cpu)");
  EXPECT_EQ(d->torch_device(), c10::Device(c10::kCPU));
  EXPECT_EQ(d->compute_dtype(), dtype::fp32);
  EXPECT_EQ(d->threads(), 1);
  EXPECT_EQ(d->memory().capacity_bytes(), chip(0).profile.memory_bytes);
  EXPECT_GT(d->memory().capacity_bytes(), 0u);
  EXPECT_EQ(d->memory().chip(), "0:0 (cpu)");
  layer_work w = compute_layer_work(job().model, 1, 2, dtype::fp32);
  EXPECT_FALSE(d->layer_seconds(w, pass::forward).has_value());
  EXPECT_FALSE(d->optimizer_seconds(1000).has_value());
  EXPECT_EQ(d->transfer_seconds(1 << 20, chip(1).profile), 0.0);
  EXPECT_EQ(d->clock().mode(), clock_mode::virtual_clock);
}

TEST(devices_context, emulated_device) {
  auto d = make(1);
  auto* e = dynamic_cast<emulated_context*>(d.get());
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(d->describe(), "0:1 (emulated:a100-sxm-40gb)");
  EXPECT_EQ(d->memory().chip(), "0:1 (emulated:a100-sxm-40gb)");
  EXPECT_EQ(d->torch_device(), c10::Device(c10::kCPU));
  EXPECT_EQ(d->compute_dtype(), dtype::bf16);
  EXPECT_EQ(d->profile().name, "a100-sxm-40gb");
  // Capacity: the profile's 40 GiB times memory_scale.
  const auto expected =
    static_cast<std::uint64_t>(std::floor(40.0 * 1024 * 1024 * 1024 * 0.001));
  EXPECT_EQ(d->memory().capacity_bytes(), expected);
  EXPECT_EQ(d->memory().capacity_bytes(), 42949672u);

  emulated_cost_function cost(d->profile(), dtype::bf16, 2);
  layer_work w = compute_layer_work(job().model, 1, 2, dtype::bf16);
  ASSERT_TRUE(d->layer_seconds(w, pass::forward).has_value());
  EXPECT_EQ(*d->layer_seconds(w, pass::forward),
            cost.layer_seconds(w, pass::forward));
  EXPECT_EQ(*d->layer_seconds(w, pass::backward),
            cost.layer_seconds(w, pass::backward));
  EXPECT_EQ(*d->optimizer_seconds(5000), cost.optimizer_seconds(5000));
  // To the H100 (450 GB/s): the A100's own 300 GB/s is the slower end.
  EXPECT_DOUBLE_EQ(d->transfer_seconds(3'000'000, chip(2).profile),
                   2 * (5e-6 + 3e6 / 300e9));
  // To the CPU (no interconnect figure): the A100's link decides.
  EXPECT_DOUBLE_EQ(d->transfer_seconds(3'000'000, chip(0).profile),
                   2 * (5e-6 + 3e6 / 300e9));
}

TEST(devices_context, emulated_link_overrides) {
  emulation_config em = job().emulation;
  em.link_bandwidth_bytes_per_second = std::numeric_limits<double>::infinity();
  em.link_latency_seconds = 1e-4;
  auto d = make(chip(1), em);
  EXPECT_DOUBLE_EQ(d->transfer_seconds(1ull << 30, chip(2).profile), 2 * 1e-4);
  em.link_bandwidth_bytes_per_second = 1e9;
  em.link_latency_seconds.reset();
  d = make(chip(1), em);
  EXPECT_DOUBLE_EQ(d->transfer_seconds(1'000'000, chip(2).profile),
                   2 * (5e-6 + 1e-3));
}

TEST(devices_context, complete_op_charges_emulated_time) {
  auto d = make(1);
  EXPECT_EQ(d->complete_op(d->clock().wall_now(), 0.125), 0.125);
  EXPECT_EQ(d->clock().virtual_now(), 0.125);
  // Without an emulated time the measured time is charged (>= 0).
  double measured = d->complete_op(d->clock().wall_now(), std::nullopt);
  EXPECT_GE(measured, 0.0);
  EXPECT_EQ(d->clock().virtual_now(), 0.125 + measured);
}

TEST(devices_context, built_backends) {
  auto b = built_backends();
  auto has = [&](const char* name) {
    return std::find(b.begin(), b.end(), name) != b.end();
  };
  EXPECT_TRUE(has("cpu"));
  EXPECT_TRUE(has("emulated"));
  EXPECT_EQ(has("cuda"), H2_HAS_CUDA == 1);
  EXPECT_EQ(has("hip"), H2_HAS_HIP == 1);
}

/// A job whose only chip is `device`.
job_config one_chip_job(const std::string& device) {
  return parse_job(test::model_toml(17, 8, 16, 2, 2) + R"(
[train]
global_batch = 4
[[nodes]]
chips = ["cpu", ")" + device +
                     R"("]
)",
                   "gpu_test.toml");
}

/// make_device must fail with device_error(unavailable) naming the chip.
void expect_unavailable(const std::string& device, const std::string& why) {
  job_config j = one_chip_job(device);
  const chip_spec& spec = *j.find_chip(chip_id{0, 1});
  try {
    auto d = make(spec, j.emulation);
    FAIL() << device << " was created on a machine without it";
  } catch (const device_error& e) {
    EXPECT_EQ(e.code(), device_errc::unavailable);
    expect_contains(e.what(), "0:1 (" + device + ")");
    expect_contains(e.what(), why);
  }
}

/// A GPU backend that was built: a chip past the last device (or any chip
/// when there is none) is unavailable, naming the chip and the runtime.
template <class Context>
void expect_missing_gpu_unavailable(const std::string& kind,
                                    const std::string& runtime) {
  const int count = Context::device_count();
  if (count > 0)
    expect_unavailable(kind + ":" + std::to_string(count),
                       "only " + std::to_string(count) + " " + runtime +
                         " device(s)");
  else
    expect_unavailable(kind + ":0", runtime + " device");
}

/// A GPU backend on a machine with a device: the chip opens and moves
/// tensors, or (libtorch without GPU support) fails with a named error.
template <class Context>
void expect_gpu_opens(const std::string& kind, const std::string& runtime) {
  if (Context::device_count() == 0)
    GTEST_SKIP() << "no " << runtime << " device on this machine";
  if (!at::hasCUDA()) {
    expect_unavailable(kind + ":0", "built without " + runtime);
    GTEST_SKIP() << "libtorch was built without GPU support; checked the "
                    "error only";
  }
  job_config j = one_chip_job(kind + ":0");
  auto d = make(*j.find_chip(chip_id{0, 1}), j.emulation);
  EXPECT_NE(dynamic_cast<Context*>(d.get()), nullptr);
  EXPECT_EQ(d->torch_device(), c10::Device(c10::kCUDA, 0));
  EXPECT_GT(d->memory().capacity_bytes(), 0u);
  EXPECT_FALSE(d->layer_seconds(compute_layer_work(j.model, 1, 1, dtype::fp32),
                                pass::forward)
                 .has_value());
  thread_binding bind(*d); // the chip's stream
  at::Tensor host = at::arange(16, at::kFloat);
  at::Tensor on_chip = d->to_device(host);
  EXPECT_EQ(on_chip.device(), d->torch_device());
  EXPECT_TRUE(d->holds(on_chip));
  EXPECT_FALSE(d->holds(host));
  d->synchronize();
  EXPECT_TRUE(d->to_host(on_chip).equal(host));
#if H2_TORCH_HAS_CUDA
  // Host copies land in pinned memory; the memory figures are the caching
  // allocator's; a bf16 chip's autocast is CUDA's; the capacity is
  // enforced, and running out of it is device_error(out_of_memory) naming
  // the chip.
  EXPECT_TRUE(d->to_host(on_chip).is_pinned());
  const auto before = d->usage();
  EXPECT_LT(before.capacity, std::uint64_t{1} << 50);
  at::Tensor block = at::empty(
    {64 << 20}, at::TensorOptions(at::kByte).device(d->torch_device()));
  EXPECT_GE(d->usage().used, before.used + (64u << 20));
  EXPECT_GE(d->usage().reserved, d->usage().used);
  block.reset();
  EXPECT_LE(d->usage().used, before.used);
  auto spec = *j.find_chip(chip_id{0, 1});
  spec.compute_dtype = dtype::bf16;
  auto bf16 = make(spec, j.emulation);
  {
    thread_binding bind_bf16(*bf16);
    compute_scope scope(*bf16);
    auto a = at::ones({4, 8}, at::TensorOptions().device(bf16->torch_device()));
    EXPECT_EQ(at::matmul(a, a.t()).scalar_type(), at::kBFloat16);
  }
  // Half a GiB past the capacity fits the device (the reserve is 1 GiB)
  // but not the chip.
  try {
    at::empty({static_cast<std::int64_t>(d->usage().capacity + (512u << 20))},
              at::TensorOptions(at::kByte).device(d->torch_device()));
    FAIL() << "allocated past the chip's capacity";
  } catch (const c10::Error& e) {
    try {
      std::rethrow_exception(d->translate(e, d->memory().failures()));
    } catch (const device_error& oom) {
      EXPECT_EQ(oom.code(), device_errc::out_of_memory);
      expect_contains(oom.what(), "0:1 (" + kind + ":0)");
    }
  }
#endif
}

TEST(devices_context, cuda_chip_without_a_device_is_unavailable) {
#if H2_HAS_CUDA
  expect_missing_gpu_unavailable<cuda_context>("cuda", "CUDA");
#else
  expect_unavailable("cuda:0", "no CUDA backend");
#endif
}

TEST(devices_context, cuda_device_opens) {
#if H2_HAS_CUDA
  expect_gpu_opens<cuda_context>("cuda", "CUDA");
#else
  GTEST_SKIP() << "this build has no CUDA backend (H2_WITH_CUDA)";
#endif
}

// Device memory shared with another process (CUDA IPC, the shm channels
// between CUDA chips). Mapping it needs a second process: bench/gpu-check.sh
// runs a two-process job for that.
TEST(devices_context, cuda_memory_is_shared_by_ipc) {
#if H2_HAS_CUDA
  const auto error_of = [](auto&& f) -> std::optional<device_error> {
    try {
      f();
    } catch (const device_error& e) {
      return e;
    }
    return std::nullopt;
  };
  // No GPU has this bus id.
  const auto foreign = error_of(
    [] { cuda_mapped_memory mapped(cuda_ipc_handle{}, "ffff:ff:1f.7"); });
  ASSERT_TRUE(foreign.has_value());
  EXPECT_EQ(foreign->code(), device_errc::unavailable);
  expect_contains(foreign->what(), "GPU ffff:ff:1f.7");
  if (cuda_context::device_count() == 0) {
    const auto none =
      error_of([] { cuda_shared_memory shared(0, std::size_t{1} << 20); });
    ASSERT_TRUE(none.has_value());
    EXPECT_EQ(none->code(), device_errc::unavailable);
    expect_contains(none->what(), "sharing 1048576 bytes of cuda:0");
    GTEST_SKIP() << "no CUDA device on this machine; checked the errors only";
  }
  if (!at::hasCUDA())
    GTEST_SKIP() << "libtorch was built without CUDA; checked the errors only";
  cuda_shared_memory shared(0, std::size_t{1} << 20);
  EXPECT_EQ(shared.size(), std::size_t{1} << 20);
  EXPECT_EQ(shared.pci_bus_id().size(), 12u); // "0000:3b:00.0"
  EXPECT_NE(shared.handle(), cuda_ipc_handle{});
  const auto on_gpu = at::TensorOptions(at::kFloat).device(c10::kCUDA, 0);
  const at::Tensor sent = at::arange(1 << 16, on_gpu);
  at::Tensor back = at::empty({1 << 16}, on_gpu);
  copy_device_memory(shared.data(), sent.data_ptr(), 1 << 18, 0);
  copy_device_memory(back.data_ptr(), shared.data(), 1 << 18, 0);
  EXPECT_TRUE(back.equal(sent));
#else
  GTEST_SKIP() << "this build has no CUDA backend (H2_WITH_CUDA)";
#endif
}

TEST(devices_context, hip_chip_without_a_device_is_unavailable) {
#if H2_HAS_HIP
  expect_missing_gpu_unavailable<hip_context>("hip", "HIP");
#else
  expect_unavailable("hip:0", "no HIP backend");
#endif
}

TEST(devices_context, hip_device_opens) {
#if H2_HAS_HIP
  expect_gpu_opens<hip_context>("hip", "HIP");
#else
  GTEST_SKIP() << "this build has no HIP backend (H2_WITH_HIP)";
#endif
}

// ---------------------------------------------------------------------------
// compute_scope and thread_binding

at::Tensor matmul_result() {
  at::Tensor a = at::ones({4, 8}, at::kFloat);
  at::Tensor b = at::ones({8, 2}, at::kFloat);
  return at::matmul(a, b);
}

TEST(devices_compute_scope, bf16_chip_runs_matmuls_in_bf16) {
  auto d = make(1);
  ASSERT_EQ(d->compute_dtype(), dtype::bf16);
  EXPECT_EQ(matmul_result().scalar_type(), at::kFloat);
  {
    compute_scope scope(*d);
    at::Tensor r = matmul_result();
    EXPECT_EQ(r.scalar_type(), at::kBFloat16);
    EXPECT_EQ(r[0][0].item<float>(), 8.0f);
    {
      compute_scope nested(*d);
      EXPECT_EQ(matmul_result().scalar_type(), at::kBFloat16);
    }
    EXPECT_EQ(matmul_result().scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(matmul_result().scalar_type(), at::kFloat);
}

TEST(devices_compute_scope, fp32_chips_run_in_fp32) {
  for (int index : {0, 2}) {
    auto d = make(index);
    ASSERT_EQ(d->compute_dtype(), dtype::fp32) << d->describe();
    compute_scope scope(*d);
    EXPECT_EQ(matmul_result().scalar_type(), at::kFloat) << d->describe();
  }
}

TEST(devices_thread_binding, binds_memory_and_threads) {
  auto d = make(1);
  const int before = at::get_num_threads();
  ASSERT_EQ(current_account(), nullptr);
  {
    thread_binding bind(*d);
    EXPECT_EQ(current_account(), d->memory_ptr());
    EXPECT_EQ(at::get_num_threads(), d->threads());
    at::Tensor t = at::empty({1000}, at::kFloat);
    EXPECT_EQ(d->memory().used_bytes(), 4000u);
  }
  EXPECT_EQ(current_account(), nullptr);
  EXPECT_EQ(at::get_num_threads(), before);
  EXPECT_EQ(d->memory().used_bytes(), 0u);
  EXPECT_EQ(d->memory().peak_bytes(), 4000u);
}

TEST(devices_context, take_aliases_host_tensors_and_charges_the_taker) {
  auto giver = make(1);
  auto taker = make(2);
  at::Tensor t;
  {
    thread_binding bind(*giver);
    t = at::arange(64, at::kFloat);
  }
  at::Tensor taken = taker->take(t);
  EXPECT_EQ(taken.data_ptr(), t.data_ptr());
  EXPECT_TRUE(taker->holds(taken));
  EXPECT_FALSE(giver->holds(taken));
  EXPECT_EQ(taker->memory().used_bytes(), 256u);
  EXPECT_EQ(giver->memory().used_bytes(), 256u);
  t.reset();
  taken.reset();
  EXPECT_EQ(taker->memory().used_bytes(), 0u);
  EXPECT_EQ(giver->memory().used_bytes(), 0u);
  // The cpu and emulated backends hand host tensors through unchanged.
  at::Tensor h = at::ones({3});
  EXPECT_EQ(giver->to_device(h).data_ptr(), h.data_ptr());
  EXPECT_EQ(giver->to_host(h).data_ptr(), h.data_ptr());
}

TEST(devices_context, own_moves_a_sole_holders_charge_and_copies_otherwise) {
  auto giver = make(1);
  auto taker = make(2);
  thread_binding bind(*taker); // own() copies on a thread bound to the taker
  at::Tensor t, kept;
  {
    thread_binding give(*giver);
    t = at::arange(64, at::kFloat);
    kept = at::arange(32, at::kFloat);
  }
  const void* data = t.data_ptr();
  // The one holder: the same bytes, now charged to the taker alone.
  at::Tensor owned = taker->own(std::exchange(t, at::Tensor()));
  EXPECT_EQ(owned.data_ptr(), data);
  EXPECT_TRUE(taker->holds(owned));
  EXPECT_EQ(giver->memory().used_bytes(), 128u); // `kept` only
  EXPECT_EQ(taker->memory().used_bytes(), 256u);
  EXPECT_TRUE(owned.equal(at::arange(64, at::kFloat)));
  // Still held elsewhere (a view of it): a copy of the taker's own.
  const auto view = kept.narrow(0, 0, 32);
  at::Tensor copied = taker->own(view);
  EXPECT_NE(copied.data_ptr(), kept.data_ptr());
  EXPECT_TRUE(copied.equal(kept));
  EXPECT_TRUE(taker->holds(copied));
  EXPECT_EQ(giver->memory().used_bytes(), 128u);
  EXPECT_EQ(taker->memory().used_bytes(), 384u);
  owned.reset();
  copied.reset();
  EXPECT_EQ(taker->memory().used_bytes(), 0u);
  EXPECT_FALSE(taker->own(at::Tensor()).defined());
}

TEST(devices_context, a_chip_holds_what_it_allocated_or_took_over) {
  auto a = make(1);
  auto b = make(2);
  EXPECT_FALSE(a->holds(at::Tensor()));
  EXPECT_FALSE(a->holds(at::ones({4}))); // allocated with no chip bound
  at::Tensor mine;
  {
    thread_binding bind(*a);
    mine = at::ones({4, 4});
    EXPECT_FALSE(a->holds(
      at::empty({4}, at::TensorOptions().device(c10::kMeta)))); // elsewhere
  }
  EXPECT_TRUE(a->holds(mine));
  EXPECT_TRUE(a->holds(mine.narrow(0, 1, 2))); // views share the storage
  EXPECT_FALSE(b->holds(mine));
  EXPECT_EQ(charged_account(mine), &a->memory());
  const auto taken = b->take(mine);
  EXPECT_TRUE(b->holds(taken));
  EXPECT_EQ(charged_account(taken), &b->memory());
}

} // namespace
} // namespace h2::devices
