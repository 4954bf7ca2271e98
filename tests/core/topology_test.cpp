// [topology] (link tiers) and plan.mode = "auto" in the job file.
#include "h2/core/job.hpp"
#include "h2/core/topology.hpp"

#include "expect_error.hpp"

#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace h2 {
namespace {

using test::expect_config_error;

/// A job of five chips on three nodes (two vendors), with `extra`
/// appended.
std::string job_text(const std::string& plan, const std::string& extra = "") {
  return test::model_toml(17, 16, 32, 2, 2) + R"(
[train]
global_batch = 4
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:h100-sxm"]
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x"]
[[nodes]]
chips = ["emulated:a100-sxm-40gb"]
[plan]
)" + plan +
         "\n" + extra;
}

TEST(core_topology, tiers_and_defaults) {
  auto job = parse_job(job_text("mode = \"auto\"", R"([topology]
nodes_per_host = 2
[topology.between_hosts]
bandwidth_gb_per_s = 25
latency_seconds = 1e-5
[topology.between_islands]
bandwidth_gb_per_s = inf
)"),
                       "t");
  EXPECT_EQ(job.topology.nodes_per_host, 2);
  EXPECT_DOUBLE_EQ(*job.topology.between_hosts.bandwidth_bytes_per_second,
                   25e9);
  EXPECT_DOUBLE_EQ(*job.topology.between_hosts.latency_seconds, 1e-5);
  EXPECT_TRUE(
    std::isinf(*job.topology.between_islands.bandwidth_bytes_per_second));
  EXPECT_FALSE(job.topology.between_islands.latency_seconds);
  EXPECT_FALSE(job.topology.same_node.bandwidth_bytes_per_second);
  const auto& a = *job.find_chip({0, 0});
  EXPECT_EQ(tier_between(job, a, *job.find_chip({0, 1})), link_tier::same_node);
  EXPECT_EQ(tier_between(job, a, *job.find_chip({1, 0})), link_tier::same_host);
  EXPECT_EQ(tier_between(job, a, *job.find_chip({2, 0})),
            link_tier::between_hosts);
  EXPECT_EQ(tier_between(job, *job.find_chip({1, 1}), *job.find_chip({2, 0})),
            link_tier::between_islands);
  EXPECT_EQ(to_string(link_tier::between_islands), "between_islands");
  // Infinite bandwidth: the latency alone (the receiver's, unscaled).
  auto l = resolve_link(job, *job.find_chip({1, 1}), *job.find_chip({2, 0}));
  EXPECT_DOUBLE_EQ(l.seconds(1e12), 5e-6);
  // Without [topology]: every node its own host.
  auto plain = parse_job(job_text("mode = \"auto\""), "t");
  EXPECT_EQ(plain.topology.nodes_per_host, 1);
  EXPECT_EQ(
    tier_between(plain, *plain.find_chip({0, 0}), *plain.find_chip({1, 0})),
    link_tier::between_hosts);
}

TEST(core_topology, bad_values_name_the_key) {
  expect_config_error(
    [] {
      parse_job(job_text("mode = \"auto\"", "[topology]\n[topology.same_host]\n"
                                            "bandwidth_gb_per_s = 0\n"),
                "t");
    },
    "topology.same_host.bandwidth_gb_per_s", {"positive"});
  expect_config_error(
    [] {
      parse_job(job_text("mode = \"auto\"", "[topology]\n[topology.same_node]\n"
                                            "latency_seconds = -1\n"),
                "t");
    },
    "topology.same_node.latency_seconds", {"expected a number in"});
  expect_config_error(
    [] {
      parse_job(job_text("mode = \"auto\"", "[topology]\nnodes_per_host = 0\n"),
                "t");
    },
    "topology.nodes_per_host", {">= 1"});
  expect_config_error(
    [] {
      parse_job(
        job_text("mode = \"auto\"", "[topology]\n[topology.between_host]\n"),
        "t");
    },
    "topology.between_host", {"unknown key", "between_hosts"});
  expect_config_error(
    [] {
      parse_job(job_text("mode = \"auto\"", "[topology]\n[topology.same_node]\n"
                                            "bandwidth = 3\n"),
                "t");
    },
    "topology.same_node.bandwidth", {"unknown key"});
}

TEST(core_topology, plan_mode_auto) {
  // Auto may list more chips than the model has layers (4 here): the
  // planner picks the depth and the replicas.
  auto job = parse_job(job_text("mode = \"auto\""), "t");
  EXPECT_EQ(job.plan.mode, plan_mode::automatic);
  EXPECT_EQ(to_string(job.plan.mode), "auto");
  EXPECT_EQ(job.plan.stages.size(), 5u);
  auto some =
    parse_job(job_text("mode = \"auto\"\nstages = [\"0:0\", \"2:0\"]"), "t");
  EXPECT_EQ(some.plan.stages, (std::vector<chip_id>{{0, 0}, {2, 0}}));
  expect_config_error([] { parse_job(job_text("mode = \"even\""), "t"); },
                      "plan.stages",
                      {"5 stages but the model has only 4 layers"});
  expect_config_error(
    [] {
      parse_job(job_text("mode = \"auto\"\nlayers = [1, 1, 1, 1, 0]"), "t");
    },
    "plan.layers", {"only allowed with plan.mode = \"manual\""});
  expect_config_error(
    [] {
      parse_job(job_text("mode = \"auto\"\nrecompute = [true, true, true, "
                         "true, true]"),
                "t");
    },
    "plan.recompute", {"not allowed with plan.mode = \"auto\""});
  expect_config_error([] { parse_job(job_text("mode = \"automatic\""), "t"); },
                      "plan.mode", {"\"even\", \"manual\", \"auto\""});
}

} // namespace
} // namespace h2
