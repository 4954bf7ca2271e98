#include "h2/devices/cpu/context.hpp"

namespace h2::devices {

cpu_context::cpu_context(const chip_spec& spec, chip_clock clock, int threads)
    : device_context(spec, spec.profile.memory_bytes, std::move(clock),
                     threads) {
}

} // namespace h2::devices
