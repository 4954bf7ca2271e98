// bf16 on the host CPU (devices/cpu_bf16.hpp, devices/bf16_gemm.hpp;
// docs/emulation.md, "bf16 on the host CPU"): which path a CPU's flags
// choose, and that the fp32-accumulate GEMMs compute what a bf16 GEMM with
// fp32 accumulation computes, forward and backward, on every host.
#include "h2/devices/bf16_gemm.hpp"
#include "h2/devices/cpu_bf16.hpp"
#include "h2/devices/device_context.hpp"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace h2::devices {
namespace {

// /proc/cpuinfo flags of the two kinds of host CI has run on.
const std::vector<std::string> avx2_epyc{"fpu", "sse4_2", "avx", "fma",
                                         "avx2", "bmi2"};
const std::vector<std::string> zen4_epyc{"avx2",        "avx512f",
                                         "avx512bw",    "avx512vl",
                                         "avx512_bf16", "avx512_vnni"};
constexpr torch_bf16_gemm onednn{true, false};

TEST(devices_cpu_bf16, a_cpu_without_bf16_instructions_accumulates_in_fp32) {
  const auto c = choose_cpu_bf16(cpu_bf16::automatic, avx2_epyc, onednn);
  EXPECT_EQ(c.path, cpu_bf16::fp32_accumulate);
  EXPECT_NE(c.reason.find("no bf16 dot-product instructions"),
            std::string::npos)
    << c.reason;
  // AVX-512 without its bf16 extension is not enough (Skylake).
  EXPECT_EQ(choose_cpu_bf16(cpu_bf16::automatic,
                            {"avx2", "avx512f", "avx512bw", "avx512vl"}, onednn)
              .path,
            cpu_bf16::fp32_accumulate);
}

TEST(devices_cpu_bf16, bf16_instructions_that_libtorch_uses_are_native) {
  const auto c = choose_cpu_bf16(cpu_bf16::automatic, zen4_epyc, onednn);
  EXPECT_EQ(c.path, cpu_bf16::native);
  EXPECT_NE(c.reason.find("avx512_bf16"), std::string::npos) << c.reason;
  EXPECT_EQ(
    choose_cpu_bf16(cpu_bf16::automatic, {"avx512f", "amx_bf16"}, onednn).path,
    cpu_bf16::native);
  // Without oneDNN libtorch's own kernels do not use the instructions.
  EXPECT_EQ(choose_cpu_bf16(cpu_bf16::automatic, zen4_epyc, {}).path,
            cpu_bf16::fp32_accumulate);
  // ARM's bf16: only libtorch 2.x sends its bf16 GEMMs to oneDNN there.
  const std::vector<std::string> graviton3{"fp", "asimd", "sve", "bf16"};
  EXPECT_EQ(choose_cpu_bf16(cpu_bf16::automatic, graviton3, onednn).path,
            cpu_bf16::fp32_accumulate);
  EXPECT_EQ(
    choose_cpu_bf16(cpu_bf16::automatic, graviton3, {true, true}).path,
    cpu_bf16::native);
}

TEST(devices_cpu_bf16, what_a_job_asks_for_is_kept) {
  for (const auto& flags : {avx2_epyc, zen4_epyc})
    for (auto asked : {cpu_bf16::native, cpu_bf16::fp32_accumulate}) {
      const auto c = choose_cpu_bf16(asked, flags, onednn);
      EXPECT_EQ(c.path, asked);
      EXPECT_NE(c.reason.find("asked for"), std::string::npos);
    }
}

TEST(devices_cpu_bf16, the_host_line_names_the_path_and_why) {
  const auto c = host_cpu_bf16(cpu_bf16::automatic);
  EXPECT_NE(c.path, cpu_bf16::automatic);
  EXPECT_FALSE(host_cpu_flags().empty()) << "no flags in /proc/cpuinfo";
  const auto line = describe(c);
  EXPECT_EQ(line.rfind("bf16 on this host's CPU: " +
                         std::string(to_string(c.path)) + " (",
                       0),
            0u)
    << line;
}

TEST(devices_cpu_bf16, host_chips_take_the_path_their_spec_asks_for) {
  for (auto asked : {cpu_bf16::native, cpu_bf16::fp32_accumulate}) {
    auto chip = make_host_device(dtype::bf16, 1, asked);
    EXPECT_EQ(chip->bf16_path(), asked);
  }
  EXPECT_EQ(make_host_device(dtype::bf16)->bf16_path(),
            host_cpu_bf16(cpu_bf16::automatic).path);
}

/// Rounds to bf16 and back: the values a bf16 tensor holds.
at::Tensor bf16(const at::Tensor& t) {
  return t.to(at::kBFloat16).to(t.scalar_type());
}

/// What a GPU's bf16 GEMM returns for bf16 operands: the exact product
/// (fp64 here, fp32 there: both far finer than bf16) rounded to bf16.
void expect_bf16_result(const at::Tensor& got, const at::Tensor& exact) {
  ASSERT_EQ(got.sizes(), exact.sizes());
  // Every element is a bf16 value ...
  EXPECT_TRUE(at::equal(bf16(got.to(at::kFloat)), got.to(at::kFloat)));
  // ... within one bf16 rounding (2^-8 relative) of the exact product.
  const auto err = (got.to(at::kDouble) - exact).abs();
  EXPECT_TRUE((err <= exact.abs() * (1.0 / 256) + 1e-30).all().item<bool>())
    << "max error " << err.max().item<double>();
}

TEST(devices_bf16_gemm, linear_is_a_bf16_gemm_with_fp32_accumulation) {
  at::manual_seed(3);
  auto x = at::randn({2, 5, 48}).requires_grad_(true);
  auto w = (at::randn({24, 48}) * 0.1).requires_grad_(true);
  auto b = (at::randn({24}) * 0.1).requires_grad_(true);
  const auto g = at::randn({2, 5, 24});
  auto y = bf16_gemm::linear(x, w, b);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  y.backward(g.to(at::kBFloat16));

  const auto xd = bf16(x.detach()).to(at::kDouble);
  const auto wd = bf16(w.detach()).to(at::kDouble);
  const auto gd = bf16(g).to(at::kDouble);
  expect_bf16_result(y,
                     at::linear(xd, wd, bf16(b.detach()).to(at::kDouble)));
  // Gradients come back in the inputs' dtype, holding bf16 values.
  ASSERT_EQ(x.grad().scalar_type(), at::kFloat);
  ASSERT_EQ(w.grad().scalar_type(), at::kFloat);
  expect_bf16_result(x.grad(), at::matmul(gd, wd));
  expect_bf16_result(w.grad(), at::mm(gd.reshape({-1, 24}).t(),
                                      xd.reshape({-1, 48})));
  expect_bf16_result(b.grad(), gd.reshape({-1, 24}).sum(0));
}

TEST(devices_bf16_gemm, linear_without_a_bias) {
  auto x = at::randn({3, 8}).to(at::kBFloat16).requires_grad_(true);
  auto w = at::randn({4, 8}).requires_grad_(true);
  auto y = bf16_gemm::linear(x, w, at::Tensor());
  y.sum().backward();
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  expect_bf16_result(y, at::linear(x.detach().to(at::kDouble),
                                   bf16(w.detach()).to(at::kDouble)));
}

TEST(devices_bf16_gemm, batched_matmul_broadcasts_and_sums_its_gradients) {
  at::manual_seed(5);
  auto a = at::randn({2, 3, 6, 16}).to(at::kBFloat16).requires_grad_(true);
  auto b = at::randn({3, 16, 6}).to(at::kBFloat16).requires_grad_(true);
  const auto g = at::randn({2, 3, 6, 6}).to(at::kBFloat16);
  auto y = bf16_gemm::matmul(a, b);
  y.backward(g);
  const auto ad = a.detach().to(at::kDouble), bd = b.detach().to(at::kDouble),
             gd = g.to(at::kDouble);
  expect_bf16_result(y, at::matmul(ad, bd));
  expect_bf16_result(a.grad(), at::matmul(gd, bd.transpose(-2, -1)));
  expect_bf16_result(b.grad(), at::matmul(ad.transpose(-2, -1), gd).sum(0));
}

TEST(devices_bf16_gemm, a_compute_scope_turns_it_on_for_its_chip_only) {
  EXPECT_FALSE(bf16_gemm::active());
  auto accumulate = make_host_device(dtype::bf16, 1, cpu_bf16::fp32_accumulate);
  auto native = make_host_device(dtype::bf16, 1, cpu_bf16::native);
  auto fp32 = make_host_device(dtype::fp32, 1, cpu_bf16::fp32_accumulate);
  {
    compute_scope scope(*accumulate);
    EXPECT_TRUE(bf16_gemm::active());
    {
      compute_scope inner(*native);
      EXPECT_FALSE(bf16_gemm::active());
    }
    EXPECT_TRUE(bf16_gemm::active());
  }
  EXPECT_FALSE(bf16_gemm::active());
  compute_scope scope(*fp32);
  EXPECT_FALSE(bf16_gemm::active());
}

TEST(devices_bf16_gemm, the_native_path_computes_the_same_products) {
  if (host_cpu_bf16(cpu_bf16::automatic).path != cpu_bf16::native)
    GTEST_SKIP() << describe(host_cpu_bf16(cpu_bf16::automatic));
  at::manual_seed(11);
  auto x = at::randn({4, 64, 128});
  auto w = at::randn({256, 128}) * 0.05;
  at::Tensor native;
  {
    auto chip = make_host_device(dtype::bf16, 1, cpu_bf16::native);
    compute_scope scope(*chip);
    native = at::linear(x, w, at::Tensor());
  }
  const auto ours = bf16_gemm::linear(x, w, at::Tensor());
  // Both round one fp32 sum per element; only its order differs.
  const auto diff = (native.to(at::kFloat) - ours.to(at::kFloat)).abs();
  EXPECT_TRUE(
    (diff <= ours.to(at::kFloat).abs() * (1.0 / 128) + 1e-6).all().item<bool>())
    << diff.max().item<double>();
}

} // namespace
} // namespace h2::devices
