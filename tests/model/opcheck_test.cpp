// The operator check (model/opcheck.hpp, docs/ditorch.md): the host CPU in
// fp32 and in bf16 autocast agrees with the fp64 reference within the
// default tolerances, and an operator that computes wrongly is caught and
// named, whichever it is.
#include "h2/model/opcheck.hpp"

#include "h2/core/error.hpp"
#include "h2/devices/cpu_bf16.hpp"
#include "h2/devices/device_context.hpp"

#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace h2::model {
namespace {

opcheck_options options() {
  opcheck_options o;
  o.shapes = test::gpt_shape(61, 16, 32, 4, 2, 128);
  o.micro_batch = 2;
  o.seed = 7;
  return o;
}

std::vector<opcheck_result>
check_cpu(dtype d, const opcheck_options& o,
          cpu_bf16 path = cpu_bf16::fp32_accumulate) {
  auto device = devices::make_host_device(d, 1, path);
  auto reference = devices::make_host_device(dtype::fp32);
  return check_operators(*device, *reference, o);
}

/// The bf16 paths this host runs: fp32-accumulate everywhere, native where
/// the CPU has bf16 instructions (devices/cpu_bf16.hpp).
std::vector<cpu_bf16> bf16_paths() {
  std::vector<cpu_bf16> out{cpu_bf16::fp32_accumulate};
  if (devices::host_cpu_bf16(cpu_bf16::automatic).path == cpu_bf16::native)
    out.push_back(cpu_bf16::native);
  return out;
}

std::set<std::string> ops_of(const std::vector<opcheck_result>& results) {
  std::set<std::string> out;
  for (const auto& r : results)
    out.insert(r.op);
  return out;
}

TEST(model_opcheck, cpu_fp32_agrees_with_the_fp64_reference) {
  const auto results = check_cpu(dtype::fp32, options());
  EXPECT_EQ(ops_of(results), std::set<std::string>(checked_operators().begin(),
                                                   checked_operators().end()));
  for (const auto& r : results) {
    SCOPED_TRACE(r.op + " " + r.tensor);
    EXPECT_TRUE(r.passed) << r.max_abs_error << " " << r.max_rel_error;
    EXPECT_EQ(r.computed, "fp32");
    EXPECT_EQ(r.tol.atol, 1e-5);
    EXPECT_GT(r.elements, 0);
    EXPECT_GT(r.cosine, 0.999999);
  }
  EXPECT_TRUE(failed_operators(results).empty());
}

TEST(model_opcheck, references_are_fp64_for_matrix_math_reductions_and_loss) {
  for (const auto& r : check_cpu(dtype::fp32, options())) {
    const bool fp64 = r.op == "linear" || r.op == "attention" ||
                      r.op == "layer_norm" || r.op == "softmax" ||
                      r.op == "cross_entropy" || r.op == "rms_norm" ||
                      r.op == "gqa_attention";
    EXPECT_EQ(r.reference, fp64 ? "fp64" : "fp32") << r.op;
  }
}

class model_opcheck_bf16 : public testing::TestWithParam<cpu_bf16> {
protected:
  void SetUp() override {
    if (GetParam() == cpu_bf16::native &&
        devices::host_cpu_bf16(cpu_bf16::automatic).path != cpu_bf16::native)
      GTEST_SKIP() << devices::describe(
        devices::host_cpu_bf16(cpu_bf16::automatic));
  }
};

TEST_P(model_opcheck_bf16, cpu_bf16_agrees_within_the_bf16_tolerance) {
  const auto results = check_cpu(dtype::bf16, options(), GetParam());
  bool some_bf16 = false;
  for (const auto& r : results) {
    SCOPED_TRACE(r.op + " " + r.tensor);
    EXPECT_TRUE(r.passed) << r.max_abs_error << " " << r.max_rel_error;
    if (r.computed == "bf16") {
      some_bf16 = true;
      EXPECT_EQ(r.tol.atol, 1.6e-2);
      // bf16 really ran: it is not bit-identical to the fp64 reference.
      EXPECT_GT(r.max_abs_error, 0);
    }
  }
  EXPECT_TRUE(some_bf16) << "autocast cast nothing to bf16";
}

INSTANTIATE_TEST_SUITE_P(
  paths, model_opcheck_bf16,
  testing::Values(cpu_bf16::fp32_accumulate, cpu_bf16::native),
  [](const testing::TestParamInfo<cpu_bf16>& p) {
    return p.param == cpu_bf16::native ? "native" : "fp32_accumulate";
  });

class model_opcheck_fault : public testing::TestWithParam<std::string> {};

TEST_P(model_opcheck_fault, a_wrong_operator_is_caught_and_named) {
  auto o = options();
  o.fault = GetParam();
  EXPECT_EQ(failed_operators(check_cpu(dtype::fp32, o)),
            std::vector<std::string>{GetParam()});
  for (cpu_bf16 path : bf16_paths()) {
    SCOPED_TRACE(std::string(to_string(path)));
    EXPECT_EQ(failed_operators(check_cpu(dtype::bf16, o, path)),
              std::vector<std::string>{GetParam()});
  }
}

INSTANTIATE_TEST_SUITE_P(every_operator, model_opcheck_fault,
                         testing::ValuesIn(checked_operators()));

TEST(model_opcheck, a_tolerance_override_applies_to_its_operator_only) {
  auto o = options();
  o.tolerances["linear"] = {0, 0}; // bf16 never meets exact equality
  const auto results = check_cpu(dtype::bf16, o);
  EXPECT_EQ(failed_operators(results), std::vector<std::string>{"linear"});
  for (const auto& r : results) {
    if (r.op == "linear") {
      EXPECT_EQ(r.tol.rtol, 0);
    }
  }
}

TEST(model_opcheck, an_unknown_operator_is_a_config_error) {
  auto o = options();
  o.tolerances["conv2d"] = {1, 1};
  EXPECT_THROW(check_cpu(dtype::fp32, o), config_error);
  o = options();
  o.fault = "relu";
  EXPECT_THROW(check_cpu(dtype::fp32, o), config_error);
}

TEST(model_opcheck, the_same_seed_gives_the_same_errors) {
  const auto a = check_cpu(dtype::bf16, options());
  const auto b = check_cpu(dtype::bf16, options());
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].max_abs_error, b[i].max_abs_error) << a[i].op;
}

} // namespace
} // namespace h2::model
