// Forward declarations of devices/ (DiTorch).
#pragma once

namespace h2::devices {

class memory_account;
class chip_clock;
class device_context;
class thread_binding;

} // namespace h2::devices
