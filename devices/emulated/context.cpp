#include "h2/devices/emulated/context.hpp"

#include <cmath>

namespace h2::devices {

namespace {

std::uint64_t scaled_capacity(const chip_spec& spec, double scale) {
  return static_cast<std::uint64_t>(
    std::floor(static_cast<double>(spec.profile.memory_bytes) * scale));
}

} // namespace

emulated_context::emulated_context(const chip_spec& spec,
                                   const emulation_config& emulation,
                                   chip_clock clock, int threads)
    : device_context(spec, scaled_capacity(spec, emulation.memory_scale),
                     std::move(clock), threads),
      cost_(spec.profile, spec.compute_dtype, emulation.time_scale,
            emulation.overhead_scale),
      link_bandwidth_override_(
        emulation.link_bandwidth_bytes_per_second.value_or(0)),
      link_latency_override_(emulation.link_latency_seconds.value_or(-1)) {
}

std::optional<double> emulated_context::layer_seconds(const layer_work& work,
                                                      pass p) const {
  return cost_.layer_seconds(work, p);
}

std::optional<double>
emulated_context::optimizer_seconds(std::int64_t parameters) const {
  return cost_.optimizer_seconds(parameters);
}

double emulated_context::transfer_seconds(std::uint64_t bytes,
                                          const chip_profile& peer) const {
  // A real peer (cpu) has no interconnect figure: this chip's link decides.
  double peer_bw = peer.interconnect_bytes_per_second > 0
                     ? peer.interconnect_bytes_per_second
                     : profile().interconnect_bytes_per_second;
  return cost_.transfer_seconds(bytes, peer_bw, link_bandwidth_override_,
                                link_latency_override_);
}

} // namespace h2::devices
