// A stage that does not fit its chip: exit code 1, one line naming the chip.
#include "launch.hpp"

#include <gtest/gtest.h>

namespace h2::test {
namespace {

struct oom_case {
  std::string name;
  /// Chip memory = profile memory x memory_scale. Two stages: 0:0
  /// (h100-sxm, 80 GiB) holds the embedding (about 26 KB at its peak), 0:1
  /// (mi250x, 128 GiB) the rest (about 200 KiB of parameters and optimizer
  /// state, 850 KB at its peak).
  std::string memory_scale;
};

void PrintTo(const oom_case& c, std::ostream* os) {
  *os << c.name << " (memory_scale " << c.memory_scale << ")";
}

class apps_oom : public ::testing::TestWithParam<oom_case> {
protected:
  scratch_dir dir_;
};

TEST_P(apps_oom, names_the_chip_and_exits_1) {
  std::string text = replaced(small_job, "memory_scale = 1e-3",
                              "memory_scale = " + GetParam().memory_scale);
  text = replaced(text, "stages = [\"0:0\", \"0:1\", \"1:0\"]",
                  "stages = [\"0:0\", \"0:1\"]");
  text = replaced(text, "layers = [2, 3, 1]", "layers = [1, 5]");
  auto job = dir_.write("job.toml", text);
  auto r = run_to_end(launch_binary, {job.string()}, dir_, run_timeout);
  ASSERT_FALSE(r.status.timed_out) << "h2-launch hung; stderr:\n" << r.err;
  EXPECT_TRUE(r.status.exited && r.status.code == 1)
    << "expected exit code 1, got " << r.status.describe() << "\nstderr:\n"
    << r.err;
  expect_one_line(r.err);
  EXPECT_NE(r.err.find("0:1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("out of memory"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("0:0"), std::string::npos)
    << "only 0:1 ran out of memory: " << r.err;
  EXPECT_EQ(r.out.find("h2: done"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(
  stages_too_big, apps_oom,
  ::testing::Values(
    // 0:1 has 134 KiB: its parameters do not fit (setup fails).
    oom_case{"at_setup", "1e-6"},
    // 0:1 has 268 KiB: its parameters fit, the first step's activations do
    // not.
    oom_case{"in_the_first_step", "2e-6"}),
  [](const ::testing::TestParamInfo<oom_case>& info) {
    return info.param.name;
  });

} // namespace
} // namespace h2::test
