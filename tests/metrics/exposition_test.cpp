// Checks the exposition with Prometheus' own parser and linter:
// `promtool check metrics` exits 0 only when the text parses and has no lint
// problems (a counter without `_total`, a missing HELP, ...).
#include "h2/metrics/registry.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace h2::metrics {
namespace {

constexpr const char* promtool = "/usr/bin/promtool";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

/// Runs promtool on `text`; returns its exit status and its output.
std::pair<int, std::string> promtool_check(const std::string& text,
                                           const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path();
  auto stem = "h2_metrics_" + tag + "_" + std::to_string(::getpid());
  auto input = dir / (stem + ".prom");
  auto output = dir / (stem + ".out");
  {
    std::ofstream out(input, std::ios::binary);
    out << text;
  }
  auto command = std::string(promtool) + " check metrics < '" + input.string() +
                 "' > '" + output.string() + "' 2>&1";
  int status = std::system(command.c_str());
  auto log = read_file(output);
  std::filesystem::remove(input);
  std::filesystem::remove(output);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return {code, log};
}

class metrics_exposition : public ::testing::Test {
protected:
  void SetUp() override {
    if (::access(promtool, X_OK) != 0)
      GTEST_SKIP() << promtool << " not found (Debian package prometheus)";
  }
};

TEST_F(metrics_exposition, promtool_accepts_a_full_registry) {
  registry r;
  r.get_counter("h2_steps_total", "Optimizer steps taken.").inc(12);
  r.get_counter("h2_transferred_bytes_total",
                "Bytes sent between chips.\nPer link.",
                {{"chip", "0:0"}, {"peer", "1:0"}})
    .inc(1.5e12);
  r.get_counter("h2_transferred_bytes_total",
                "Bytes sent between chips.\nPer link.",
                {{"chip", "0:1"}, {"peer", "1:1"}});
  r.get_gauge("h2_memory_used_bytes", "Device memory in use, back\\slash.",
              {{"chip", "0:0"}, {"vendor", "NVIDIA"}})
    .set(7.25e10);
  r.get_gauge("h2_memory_used_bytes", "Device memory in use, back\\slash.",
              {{"chip", "0:1"}, {"vendor", "AMD \"Instinct\""}})
    .set(0.1);
  auto& awkward =
    r.get_gauge("h2_awkward_ratio", "Values and labels that need care.",
                {{"path", "C:\\runs\\"},
                 {"quote", "\"x\""},
                 {"nl", "a\nb"},
                 {"utf8", "\xC3\xA9t\xC3\xA9 \xE2\x9C\x93"},
                 {"bad", "\xFF\xFE"},
                 {"empty", ""},
                 {"brace", "}{,="}});
  awkward.set(std::numeric_limits<double>::quiet_NaN());
  r.get_gauge("h2_awkward_ratio", "Values and labels that need care.",
              {{"path", "pos"}})
    .set(std::numeric_limits<double>::infinity());
  r.get_gauge("h2_awkward_ratio", "Values and labels that need care.",
              {{"path", "neg"}})
    .set(-std::numeric_limits<double>::infinity());
  r.get_gauge("h2_awkward_ratio", "Values and labels that need care.",
              {{"path", "tiny"}})
    .set(1e-300);
  auto& h = r.get_histogram("h2_step_seconds", "Time of one step.",
                            {0.001, 0.01, 0.1, 1, 10}, {{"stage", "0"}});
  for (double v : {0.0005, 0.02, 0.5, 0.7, 30.0})
    h.observe(v);
  r.get_histogram("h2_step_seconds", "Time of one step.",
                  {0.001, 0.01, 0.1, 1, 10}, {{"stage", "1"}});
  r.get_histogram("h2_queue_wait_seconds", "No buckets but +Inf.", {})
    .observe(3);

  auto text = r.expose();
  auto [code, log] = promtool_check(text, "full");
  EXPECT_EQ(code, 0) << "promtool said:\n" << log << "\non:\n" << text;
}

// The test above is not one that can only pass: promtool does reject what
// the registry refuses to write.
TEST_F(metrics_exposition, promtool_rejects_broken_text) {
  auto [code, log] = promtool_check("# TYPE h2_x counter\nh2_x 1\n", "lint");
  EXPECT_NE(code, 0) << log;
  auto [code2, log2] = promtool_check("h2_y{a=\"unterminated} 1\n", "syntax");
  EXPECT_NE(code2, 0) << log2;
}

} // namespace
} // namespace h2::metrics
