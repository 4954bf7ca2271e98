// The Prometheus endpoint of a running h2-launch.
#include "launch.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <regex>

namespace h2::test {
namespace {

using namespace std::chrono_literals;

class apps_metrics : public ::testing::Test {
protected:
  scratch_dir dir_;
};

/// The port of "h2: metrics at http://127.0.0.1:PORT/metrics" (0: none).
int metrics_port(const std::string& out) {
  static const std::regex re(
    R"(h2: metrics at http://127\.0\.0\.1:(\d+)/metrics)");
  std::smatch m;
  return std::regex_search(out, m, re) ? std::stoi(m[1]) : 0;
}

TEST_F(apps_metrics, endpoint_serves_valid_prometheus_text) {
  auto job = dir_.write("job.toml", small_job);
  child_process child(
    launch_binary, {job.string(), "--metrics-port", "0", "--steps", "1000000"},
    dir_ / "stdout.txt", dir_ / "stderr.txt");
  ASSERT_TRUE(child.wait_until([&] { return !step_lines(child.out()).empty(); },
                               run_timeout))
    << "no step line; " << child.wait(1s).describe() << "\nstderr:\n"
    << child.err();
  int port = metrics_port(child.out());
  ASSERT_GT(port, 0) << "no metrics line in stdout:\n" << child.out();

  std::string response;
  ASSERT_NO_THROW(response = http_get(port, "/metrics"));
  auto head_end = response.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << response;
  std::string head = response.substr(0, head_end);
  std::string body = response.substr(head_end + 4);
  EXPECT_TRUE(head.rfind("HTTP/1.1 200", 0) == 0 ||
              head.rfind("HTTP/1.0 200", 0) == 0)
    << head;
  EXPECT_NE(head.find("text/plain"), std::string::npos) << head;

  // Run-wide series, per-chip series for every chip of the plan (with its
  // id, profile and stage as labels), channel traffic.
  for (const char* series :
       {"\nh2_loss ", "\nh2_step_seconds ", "\nh2_tokens_per_second ",
        "\nh2_steps_total ", "\nh2_channel_sent_bytes_total{",
        "\nh2_channel_received_bytes_total{",
        "\nh2_channel_sent_device_bytes_total{"})
    EXPECT_NE(body.find(series), std::string::npos)
      << "no " << series + 1 << " in:\n"
      << body;
  const std::vector<std::pair<std::string, std::string>> chips = {
    {"0:0", "h100-sxm"}, {"0:1", "mi250x"}, {"1:0", "a100-sxm-40gb"}};
  for (int stage = 0; stage < 3; ++stage) {
    auto& [chip, profile] = chips[stage];
    for (const char* name :
         {"h2_chip_forward_seconds_total", "h2_chip_backward_seconds_total",
          "h2_chip_memory_used_bytes", "h2_chip_memory_capacity_bytes"}) {
      std::string series = std::string("\n") + name + "{chip=\"" + chip +
                           "\",profile=\"" + profile + "\"";
      auto at = body.find(series);
      EXPECT_NE(at, std::string::npos) << "no " << series.substr(1) << " in:\n"
                                       << body;
      if (at != std::string::npos) {
        auto line = body.substr(at + 1, body.find('\n', at + 1) - at - 1);
        EXPECT_NE(line.find("stage=\"" + std::to_string(stage) + "\""),
                  std::string::npos)
          << line;
      }
    }
  }
  EXPECT_EQ(body.find("chip=\"1:1\""), std::string::npos)
    << "1:1 holds no stage";

  // The live page is open by default ([admin] page = "open"): its data
  // without a token, the page with a policy that admits only this server.
  std::string state;
  ASSERT_NO_THROW(state = http_get(port, "/api/state"));
  EXPECT_EQ(state.rfind("HTTP/1.1 200", 0), 0u) << state;
  for (const char* chip : {"\"chip\":\"0:0\"", "\"chip\":\"0:1\"",
                           "\"chip\":\"1:0\"", "\"status\":\"training\""})
    EXPECT_NE(state.find(chip), std::string::npos) << chip << " in " << state;
  std::string page;
  ASSERT_NO_THROW(page = http_get(port, "/"));
  EXPECT_NE(page.find("Content-Security-Policy: default-src 'none'; "
                      "script-src 'self'"),
            std::string::npos)
    << page;
  EXPECT_NE(page.find("<script src=\"/page.js\""), std::string::npos) << page;

  // A clean stop on SIGTERM.
  child.send(SIGTERM);
  auto status = child.wait(run_timeout);
  EXPECT_TRUE(status.exited && status.code == 128 + SIGTERM)
    << status.describe() << "\nstderr:\n"
    << child.err();

  // promtool agrees it is valid exposition text.
  auto metrics_file = dir_.write("metrics.txt", body);
  if (!std::filesystem::exists("/usr/bin/promtool"))
    GTEST_SKIP() << "/usr/bin/promtool is missing: the exposition text was "
                    "not checked by Prometheus' own parser";
  scratch_dir promtool_dir;
  auto r = run_to_end("/usr/bin/promtool", {"check", "metrics"}, promtool_dir,
                      60s, metrics_file);
  EXPECT_TRUE(r.status.exited && r.status.code == 0)
    << "promtool check metrics: " << r.status.describe() << "\n"
    << r.out << r.err;
}

TEST_F(apps_metrics, busy_port_is_bad_input) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  int port = ntohs(addr.sin_port);

  auto job = dir_.write("job.toml", small_job);
  auto r = run_to_end(launch_binary,
                      {job.string(), "--metrics-port", std::to_string(port)},
                      dir_, run_timeout);
  ::close(fd);
  ASSERT_FALSE(r.status.timed_out);
  EXPECT_TRUE(r.status.exited && r.status.code == 2)
    << r.status.describe() << "\n"
    << r.err;
  expect_one_line(r.err);
  EXPECT_NE(r.err.find("metrics.port"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::to_string(port)), std::string::npos) << r.err;
  EXPECT_TRUE(step_lines(r.out).empty()) << r.out;
}

} // namespace
} // namespace h2::test
