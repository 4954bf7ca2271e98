// h2-opcheck (docs/ditorch.md): the host CPU passes in fp32 and in bf16
// against the fp64 reference (exit 0), a wrong operator fails and is named
// (exit 4), bad input is one line and exit 2, a missing device exit 1; a
// job with `[ditorch] check = true` checks its chips before it trains, in
// one process and on each node.
#include "launch.hpp"

#include "h2/apps/opcheck.hpp"
#include "h2/core/job.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace h2::test {
namespace {

const std::string opcheck_binary = H2_OPCHECK;

class apps_opcheck : public ::testing::Test {
protected:
  run_result opcheck(std::vector<std::string> args) {
    args.insert(args.end(), {"--job", job_.string()});
    return run_to_end(opcheck_binary, args, dir_, run_timeout);
  }

  scratch_dir dir_;
  std::filesystem::path job_ = dir_.write("job.toml", small_job);
};

/// The table row of `op`'s first tensor.
std::string row_of(const std::string& out, const std::string& op) {
  for (const auto& line : lines_of(out))
    if (line.rfind(op + " ", 0) == 0)
      return line;
  return "";
}

TEST_F(apps_opcheck, cpu_passes_in_fp32_and_bf16_against_fp64) {
  // bf16 on the path this host chooses, and on fp32-accumulate, which every
  // host runs (docs/emulation.md, "bf16 on the host CPU").
  for (const std::string path : {"", "auto", "fp32-accumulate"}) {
    const std::string dtype = path.empty() ? "fp32" : "bf16";
    SCOPED_TRACE(dtype + " " + path);
    std::vector<std::string> args{"--device", "cpu", "--dtype", dtype};
    if (!path.empty()) {
      args.push_back("--cpu-bf16");
      args.push_back(path);
    }
    auto r = opcheck(args);
    EXPECT_TRUE(r.status.exited && r.status.code == 0)
      << r.status.describe() << "\n"
      << r.out << r.err;
    EXPECT_NE(r.out.find("all 12 operators pass"), std::string::npos) << r.out;
    for (const char* op : {"embedding", "layer_norm", "linear", "attention",
                           "gelu", "softmax", "cross_entropy", "adamw"})
      EXPECT_NE(row_of(r.out, op).find("pass"), std::string::npos) << op << "\n"
                                                                   << r.out;
    EXPECT_NE(row_of(r.out, "linear").find(dtype + "/fp64"), std::string::npos)
      << r.out;
    EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
    const auto said = r.out.find("h2-opcheck: bf16 on this host's CPU: ");
    ASSERT_NE(said, std::string::npos) << r.out;
    if (path == "fp32-accumulate") {
      EXPECT_EQ(r.out.find("fp32-accumulate (asked for", said), said + 37)
        << r.out;
    }
  }
}

TEST_F(apps_opcheck, a_wrong_operator_fails_with_exit_4_and_is_named) {
  auto r = opcheck({"--device", "cpu", "--test-fault", "softmax"});
  EXPECT_TRUE(r.status.exited && r.status.code == 4) << r.status.describe();
  EXPECT_NE(r.out.find("1 of 12 operators failed: softmax"), std::string::npos)
    << r.out;
  EXPECT_NE(row_of(r.out, "softmax").find("FAIL"), std::string::npos) << r.out;
  EXPECT_NE(row_of(r.out, "gelu").find("pass"), std::string::npos) << r.out;
}

TEST_F(apps_opcheck, a_tolerance_override_can_fail_an_operator) {
  auto r = opcheck(
    {"--device", "cpu", "--dtype", "bf16", "--tolerance", "linear=0,0"});
  EXPECT_TRUE(r.status.exited && r.status.code == 4) << r.status.describe();
  EXPECT_NE(r.out.find("operators failed: linear"), std::string::npos) << r.out;
}

TEST_F(apps_opcheck, bad_input_is_one_line_and_exit_2) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
    {{"--device", "cpu", "--dtype", "fp16"}, "--dtype"},
    {{"--device", "tpu:0"}, "--device"},
    {{"--device", "emulated:h100-sxm"}, "check \"cpu\""},
    {{"--device", "cpu", "--reference", "cuda:x"}, "--reference"},
    {{"--device", "cpu", "--tolerance", "linear"}, "--tolerance"},
    {{"--device", "cpu", "--tolerance", "conv=1e-3"}, "conv"},
    {{"--device", "cpu", "--cpu-bf16", "fast"}, "--cpu-bf16"},
  };
  for (const auto& [args, needle] : cases) {
    SCOPED_TRACE(args.back());
    auto r = opcheck(args);
    EXPECT_TRUE(r.status.exited && r.status.code == 2) << r.status.describe();
    expect_one_line(r.err);
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }
}

TEST_F(apps_opcheck, a_device_that_is_not_here_is_exit_1) {
  auto r = opcheck({"--device", "cuda:99"});
  EXPECT_TRUE(r.status.exited && r.status.code == 1) << r.status.describe();
  expect_one_line(r.err);
  EXPECT_NE(r.err.find("cuda:99"), std::string::npos) << r.err;
}

TEST_F(apps_opcheck, a_job_asking_for_the_check_runs_it_before_training) {
  auto job =
    dir_.write("checked.toml", small_job + "\n[ditorch]\ncheck = true\n");
  auto r =
    run_to_end(launch_binary, {job.string(), "--no-metrics", "--steps", "2"},
               dir_, run_timeout);
  EXPECT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\n"
    << r.err;
  // small_job's chips compute on the host CPU in bf16 and in fp32.
  EXPECT_NE(r.out.find("ditorch check: cpu (bf16) against cpu: 12 operators "
                       "pass"),
            std::string::npos)
    << r.out;
  EXPECT_NE(r.out.find("ditorch check: cpu (fp32) against cpu: 12 operators "
                       "pass"),
            std::string::npos)
    << r.out;
  EXPECT_LT(r.out.find("ditorch check"), r.out.find("step 1"))
    << "the check comes before training\n"
    << r.out;
}

TEST_F(apps_opcheck, each_node_checks_its_own_chips) {
  auto job = dir_.write("checked.toml",
                        small_job + "\n[ditorch]\ncheck = true\n");
  auto r = run_to_end(
    launch_binary,
    {job.string(), "--nodes", "2", "--no-metrics", "--steps", "2"}, dir_,
    run_timeout);
  EXPECT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\n"
    << r.err;
  // Node 0: two bf16 chips; node 1: a bf16 and an fp32 chip.
  auto count = [&](const std::string& needle) {
    int n = 0;
    for (auto at = r.out.find(needle); at != std::string::npos;
         at = r.out.find(needle, at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(count("ditorch check: cpu (bf16) against cpu: 12 operators pass"),
            2)
    << r.out;
  EXPECT_EQ(count("ditorch check: cpu (fp32) against cpu: 12 operators pass"),
            1)
    << r.out;
}

TEST(apps_opcheck_before_training, a_failed_operator_is_exit_4_and_named) {
  const auto job = parse_job(small_job, "small.toml");
  auto options = apps::opcheck_options_of(job);
  options.fault = "layer_norm";
  std::ostringstream out;
  testing::internal::CaptureStderr();
  const int rc =
    apps::check_chip_operators("h2-launch", job, job.chips(), options, out);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 4);
  // small_job's chips compute on the host in bf16 and in fp32: both fail.
  EXPECT_NE(out.str().find("cpu (bf16) against cpu: 1 of 12 operators "
                           "failed: layer_norm"),
            std::string::npos)
    << out.str();
  EXPECT_NE(out.str().find("cpu (fp32) against cpu: 1 of 12 operators "
                           "failed: layer_norm"),
            std::string::npos)
    << out.str();
  EXPECT_NE(out.str().find("FAIL"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("gelu "), std::string::npos)
    << "only failed rows are printed\n"
    << out.str();
  EXPECT_NE(err.find("h2-launch: error: cpu (bf16) failed the operator check"),
            std::string::npos)
    << err;
}

} // namespace
} // namespace h2::test
