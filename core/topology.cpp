#include "h2/core/topology.hpp"

#include "h2/core/job.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace h2 {

std::string_view to_string(link_tier t) noexcept {
  switch (t) {
    case link_tier::same_node:
      return "same_node";
    case link_tier::same_host:
      return "same_host";
    case link_tier::between_hosts:
      return "between_hosts";
    case link_tier::between_islands:
      return "between_islands";
  }
  return "unknown";
}

const tier_figures& topology_config::figures(link_tier t) const noexcept {
  switch (t) {
    case link_tier::same_node:
      return same_node;
    case link_tier::same_host:
      return same_host;
    case link_tier::between_hosts:
      return between_hosts;
    case link_tier::between_islands:
      return between_islands;
  }
  return between_islands;
}

double link_figures::seconds(double bytes) const noexcept {
  double wire = std::isinf(bandwidth_bytes_per_second)
                  ? 0.0
                  : bytes / bandwidth_bytes_per_second;
  return time_scale * (latency_seconds + wire);
}

link_tier tier_between(const job_config& job, const chip_spec& a,
                       const chip_spec& b) {
  if (a.id.node == b.id.node)
    return link_tier::same_node;
  const int per_host = std::max(1, job.topology.nodes_per_host);
  if (a.id.node / per_host == b.id.node / per_host)
    return link_tier::same_host;
  if (a.profile.vendor == b.profile.vendor)
    return link_tier::between_hosts;
  return link_tier::between_islands;
}

link_figures resolve_link(const job_config& job, const chip_spec& from,
                          const chip_spec& to) {
  link_figures f;
  f.tier = tier_between(job, from, to);
  const tier_figures& given = job.topology.figures(f.tier);
  const auto& em = job.emulation;
  const bool emulated = to.backend == device_backend::emulated;
  // The defaults mirror emulated_context::transfer_seconds: the receiver
  // times the transfer; a peer without an interconnect figure (cpu) leaves
  // the receiver's own link to decide.
  double bandwidth = std::numeric_limits<double>::infinity();
  double latency = 0;
  if (emulated) {
    double peer = from.profile.interconnect_bytes_per_second > 0
                    ? from.profile.interconnect_bytes_per_second
                    : to.profile.interconnect_bytes_per_second;
    bandwidth = em.link_bandwidth_bytes_per_second.value_or(
      std::min(to.profile.interconnect_bytes_per_second, peer));
    latency = em.link_latency_seconds.value_or(
      to.profile.emulation.link_latency_seconds * em.overhead_scale);
    f.time_scale = em.time_scale;
  }
  f.bandwidth_bytes_per_second = given.bandwidth_bytes_per_second.value_or(
    bandwidth > 0 ? bandwidth : std::numeric_limits<double>::infinity());
  f.latency_seconds = given.latency_seconds.value_or(latency);
  return f;
}

} // namespace h2
