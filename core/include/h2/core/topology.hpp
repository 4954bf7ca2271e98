// How the chips of a job are connected (the job file's [topology] table):
// links fall into tiers from the closest (same node) to the farthest
// (between vendor islands), each with a bandwidth and a latency. Shared by
// the planner (scheduler/), which predicts transfer times from it, and by
// whatever times real or emulated transfers.
#pragma once

#include <optional>
#include <string_view>

namespace h2 {

struct chip_spec;
struct job_config;

/// How two chips are connected, from the closest to the farthest.
enum class link_tier {
  same_node,      ///< chips of one h2-node process (NVLink, Infinity Fabric)
  same_host,      ///< nodes on one machine (shared memory)
  between_hosts,  ///< machines of one vendor island (RDMA, same fabric)
  between_islands ///< chips of different vendors on different machines
};

/// "same_node", "same_host", "between_hosts", "between_islands".
std::string_view to_string(link_tier t) noexcept;

/// One tier's figures as the job file states them; absent figures come from
/// the two chips' own (their profiles' interconnect and link latency, with
/// the [emulation] overrides).
struct tier_figures {
  std::optional<double> bandwidth_bytes_per_second; ///< one direction
  std::optional<double> latency_seconds;
};

/// The job file's [topology] table (docs/job-file.md).
struct topology_config {
  /// Consecutive node ranks that share a machine: nodes r and q are on one
  /// host when r / nodes_per_host == q / nodes_per_host.
  int nodes_per_host = 1;
  tier_figures same_node;
  tier_figures same_host;
  tier_figures between_hosts;
  tier_figures between_islands;

  /// The figures of tier `t`.
  const tier_figures& figures(link_tier t) const noexcept;
};

/// What one point-to-point transfer costs: seconds(bytes) =
/// time_scale x (latency + bytes / bandwidth).
struct link_figures {
  link_tier tier = link_tier::same_node;
  double bandwidth_bytes_per_second = 0; ///< +inf: the latency alone
  double latency_seconds = 0;
  double time_scale = 1; ///< the emulation's time_scale (1 on real chips)

  /// Seconds to move `bytes` over this link.
  double seconds(double bytes) const noexcept;
};

/// The tier of the link between chips `a` and `b` of `job`: same node rank,
/// same host (nodes_per_host), same vendor (an island), or different vendors.
link_tier tier_between(const job_config& job, const chip_spec& a,
                       const chip_spec& b);

/// The link a transfer from `from` to `to` takes, timed as the receiving
/// chip times it. Without figures for its tier in [topology] this is exactly
/// what an emulated receiver charges (devices/emulated: the slower chip's
/// interconnect, the receiver's link latency x overhead_scale, both
/// overridable in [emulation], all x time_scale); a real receiver
/// (cpu/cuda/hip) measures its transfers and charges nothing extra, so the
/// default there is free. Pure function of the job.
link_figures resolve_link(const job_config& job, const chip_spec& from,
                          const chip_spec& to);

} // namespace h2
