#include "h2/devices/cpu/context.hpp"

namespace h2::devices {

cpu_context::cpu_context(const chip_spec& spec,
                         chip_clock::wall_clock::time_point origin,
                         int threads, clock_mode clock)
  : device_context(spec, spec.profile.memory_bytes, chip_clock(clock, origin),
                   threads) {
}

} // namespace h2::devices
