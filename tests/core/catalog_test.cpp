#include "h2/core/catalog.hpp"
#include "h2/core/profile.hpp"

#include "expect_error.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

namespace h2 {
namespace {

using test::expect_config_error;

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

TEST(core_catalog, builtin_has_profiles_from_several_vendors) {
  const auto& cat = catalog::builtin();
  std::set<std::string> vendors;
  for (const auto& [name, p] : cat.profiles())
    vendors.insert(p.vendor);
  EXPECT_GE(cat.profiles().size(), 6u);
  EXPECT_GE(vendors.size(), 3u);
}

TEST(core_catalog, builtin_profiles_are_complete) {
  for (const auto& [name, p] : catalog::builtin().profiles()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(p.name, name);
    EXPECT_FALSE(p.vendor.empty());
    EXPECT_FALSE(p.model.empty());
    EXPECT_FALSE(p.source.empty());
    EXPECT_NE(p.source.find("https://"), std::string::npos)
      << "source should name the spec sheet's URL: " << p.source;
    EXPECT_GT(p.memory_bytes, 0u);
    EXPECT_GT(p.memory_bandwidth_bytes_per_second, 0);
    EXPECT_GT(p.interconnect_bytes_per_second, 0);
    EXPECT_TRUE(p.peak_tflops_fp32 > 0 || p.peak_tflops_bf16 > 0);
    EXPECT_GT(p.emulation.max_efficiency, 0);
    EXPECT_LE(p.emulation.max_efficiency, 1);
    EXPECT_GT(p.emulation.half_efficiency_rows, 0);
    EXPECT_GT(p.emulation.op_overhead_seconds, 0);
    EXPECT_GT(p.emulation.link_latency_seconds, 0);
  }
}

TEST(core_catalog, builtin_h100_figures_and_units) {
  const chip_profile* p = catalog::builtin().find("h100-sxm");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->vendor, "NVIDIA");
  EXPECT_EQ(p->model, "H100 SXM5 80GB");
  EXPECT_DOUBLE_EQ(p->peak_tflops_fp32, 67.0);
  EXPECT_DOUBLE_EQ(p->peak_tflops_bf16, 989.4);
  EXPECT_DOUBLE_EQ(p->peak_flops(dtype::bf16), 989.4e12);
  EXPECT_DOUBLE_EQ(p->peak_flops(dtype::fp32), 67.0e12);
  EXPECT_EQ(p->memory_bytes, 80ull << 30);
  EXPECT_DOUBLE_EQ(p->memory_bandwidth_bytes_per_second, 3350e9);
  EXPECT_DOUBLE_EQ(p->interconnect_bytes_per_second, 450e9);
  EXPECT_DOUBLE_EQ(p->emulation.max_efficiency, 0.70);
  EXPECT_DOUBLE_EQ(p->emulation.half_efficiency_rows, 256);
  EXPECT_DOUBLE_EQ(p->emulation.op_overhead_seconds, 15e-6);
  EXPECT_DOUBLE_EQ(p->emulation.link_latency_seconds, 5e-6);
}

TEST(core_catalog, find_unknown_is_null_and_names_are_sorted) {
  const auto& cat = catalog::builtin();
  EXPECT_EQ(cat.find("nope"), nullptr);
  EXPECT_EQ(cat.find(""), nullptr);
  auto names = cat.names();
  EXPECT_EQ(names.size(), cat.profiles().size());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const auto& n : names)
    EXPECT_NE(cat.find(n), nullptr) << n;
}

const char* const valid_profile = R"(
[acme-x1]
vendor = "Acme"
model = "X1"
peak_tflops = { fp32 = 10, bf16 = 40.5, fp16 = 0 }
memory_gib = 16
memory_bandwidth_gb_per_s = 1000
interconnect_gb_per_s = 50
source = "https://example.com/x1"
)";

TEST(core_catalog, parse_reads_a_profile_with_default_emulation) {
  auto cat = catalog::parse(valid_profile, "test");
  ASSERT_EQ(cat.profiles().size(), 1u);
  const chip_profile* p = cat.find("acme-x1");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name, "acme-x1");
  EXPECT_EQ(p->vendor, "Acme");
  EXPECT_EQ(p->model, "X1");
  EXPECT_DOUBLE_EQ(p->peak_tflops_fp32, 10);
  EXPECT_DOUBLE_EQ(p->peak_tflops_bf16, 40.5);
  EXPECT_DOUBLE_EQ(p->peak_tflops_fp16, 0);
  EXPECT_EQ(p->peak_flops(dtype::fp16), 0);
  EXPECT_EQ(p->memory_bytes, 16ull << 30);
  EXPECT_DOUBLE_EQ(p->memory_bandwidth_bytes_per_second, 1000e9);
  EXPECT_DOUBLE_EQ(p->interconnect_bytes_per_second, 50e9);
  EXPECT_EQ(p->source, "https://example.com/x1");
  emulation_params d;
  EXPECT_EQ(p->emulation.max_efficiency, d.max_efficiency);
  EXPECT_EQ(p->emulation.half_efficiency_rows, d.half_efficiency_rows);
  EXPECT_EQ(p->emulation.op_overhead_seconds, d.op_overhead_seconds);
  EXPECT_EQ(p->emulation.link_latency_seconds, d.link_latency_seconds);
}

TEST(core_catalog, parse_model_defaults_to_name_and_reads_emulation) {
  std::string text = R"(
[b]
vendor = "V"
peak_tflops = { fp32 = 1, bf16 = 0, fp16 = 0 }
memory_gib = 0.5
memory_bandwidth_gb_per_s = 1
interconnect_gb_per_s = 1
[b.emulation]
max_efficiency = 1
op_overhead_seconds = 1e-3
)";
  auto cat = catalog::parse(text, "test");
  const chip_profile* p = cat.find("b");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->model, "b");
  EXPECT_EQ(p->source, "");
  EXPECT_EQ(p->memory_bytes, 512ull << 20);
  EXPECT_DOUBLE_EQ(p->emulation.max_efficiency, 1.0);
  EXPECT_DOUBLE_EQ(p->emulation.op_overhead_seconds, 1e-3);
  EXPECT_DOUBLE_EQ(p->emulation.half_efficiency_rows,
                   emulation_params{}.half_efficiency_rows);
}

/// valid_profile with `from` replaced by `to` (which must be present).
std::string with(const std::string& from, const std::string& to,
                 std::string text = valid_profile) {
  auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << "test bug: '" << from << "' not found";
  if (pos != std::string::npos)
    text.replace(pos, from.size(), to);
  return text;
}

TEST(core_catalog, parse_errors_name_the_key_path) {
  auto parse = [](const std::string& text) {
    return [text] {
      catalog::parse(text, "test");
    };
  };
  expect_config_error(parse(with("bf16 = 40.5", "bf16 = \"fast\"")),
                      "acme-x1.peak_tflops.bf16",
                      {"expected a number", "a string"});
  expect_config_error(parse(with("bf16 = 40.5", "bf16 = -1")),
                      "acme-x1.peak_tflops.bf16", {"non-negative", "-1"});
  expect_config_error(parse(with("bf16 = 40.5", "bf16 = nan")),
                      "acme-x1.peak_tflops.bf16", {"non-negative"});
  expect_config_error(
    parse(with("fp32 = 10", "fp32 = 0", with("bf16 = 40.5", "bf16 = 0"))),
    "acme-x1.peak_tflops", {"non-zero fp32 or bf16"});
  expect_config_error(parse(with(", fp16 = 0", ", fp16 = 0, fp8 = 1")),
                      "acme-x1.peak_tflops.fp8", {"unknown key"});
  expect_config_error(parse(with("vendor = \"Acme\"\n", "")), "acme-x1.vendor",
                      {"missing required key"});
  expect_config_error(
    parse(with("peak_tflops = { fp32 = 10, bf16 = 40.5, fp16 = 0 }\n", "")),
    "acme-x1.peak_tflops", {"missing required table"});
  expect_config_error(parse(with("memory_gib = 16", "memory_gib = 0")),
                      "acme-x1.memory_gib", {"positive", "0"});
  expect_config_error(parse(with("memory_bandwidth_gb_per_s = 1000",
                                 "memory_bandwidth_gb_per_s = \"1000\"")),
                      "acme-x1.memory_bandwidth_gb_per_s",
                      {"expected a number"});
  expect_config_error(parse(with("source =", "sauce = \"x\"\nsource =")),
                      "acme-x1.sauce",
                      {"unknown key", "did you mean 'source'"});
  expect_config_error(parse(std::string(valid_profile) +
                            "[acme-x1.emulation]\nmax_efficiency = 1.5\n"),
                      "acme-x1.emulation.max_efficiency", {"fraction"});
  expect_config_error(parse(std::string(valid_profile) +
                            "[acme-x1.emulation]\nhalf_efficiency_rows = 0\n"),
                      "acme-x1.emulation.half_efficiency_rows", {"positive"});
  expect_config_error(
    parse(std::string(valid_profile) + "[acme-x1.emulation]\nspeed = 1\n"),
    "acme-x1.emulation.speed", {"unknown key"});
  expect_config_error(parse("loose = 1\n" + std::string(valid_profile)),
                      "loose", {"expected a table", "an integer"});
}

TEST(core_catalog, parse_error_in_a_builtin_like_table) {
  // The built-in H100 entry with a wrong peak: the path names the profile.
  expect_config_error(
    [] {
      catalog::parse(
        with("[acme-x1]", "[h100-sxm]", with("bf16 = 40.5", "bf16 = true")),
        "catalog.toml");
    },
    "h100-sxm.peak_tflops.bf16", {"expected a number, got a boolean"});
}

TEST(core_catalog, parse_errors_carry_the_key_prefix) {
  expect_config_error(
    [] {
      catalog::parse(with("memory_gib = 16", "memory_gib = -3"), "job.toml",
                     "profiles");
    },
    "profiles.acme-x1.memory_gib", {"positive"});
}

TEST(core_catalog, syntax_error_names_line_and_column) {
  expect_config_error([] { catalog::parse("[a]\nvendor = \n", "cat.toml"); },
                      "", {"cat.toml:2:"});
}

TEST(core_catalog, add_rejects_a_taken_name) {
  auto cat = catalog::parse(valid_profile, "test");
  chip_profile p = *cat.find("acme-x1");
  expect_config_error([&] { cat.add(p, "profiles.acme-x1"); },
                      "profiles.acme-x1", {"'acme-x1' already exists"});
  p.name = "acme-x2";
  cat.add(p, "profiles.acme-x2");
  ASSERT_NE(cat.find("acme-x2"), nullptr);
  EXPECT_EQ(cat.find("acme-x2")->vendor, "Acme");
}

TEST(core_profile, dtype_names_and_sizes) {
  for (dtype d : {dtype::fp32, dtype::bf16, dtype::fp16}) {
    auto back = parse_dtype(to_string(d));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(to_string(dtype::bf16), "bf16");
  EXPECT_FALSE(parse_dtype("float32").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
  EXPECT_EQ(dtype_bytes(dtype::fp32), 4);
  EXPECT_EQ(dtype_bytes(dtype::bf16), 2);
  EXPECT_EQ(dtype_bytes(dtype::fp16), 2);
}

TEST(core_profile, peak_flops_per_dtype) {
  chip_profile p;
  p.peak_tflops_fp32 = 1.5;
  p.peak_tflops_bf16 = 0;
  p.peak_tflops_fp16 = 7;
  EXPECT_DOUBLE_EQ(p.peak_flops(dtype::fp32), 1.5e12);
  EXPECT_EQ(p.peak_flops(dtype::bf16), 0);
  EXPECT_DOUBLE_EQ(p.peak_flops(dtype::fp16), 7e12);
}

} // namespace
} // namespace h2
