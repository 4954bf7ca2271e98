#include "h2/runtime/reports.hpp"

#include <array>

namespace h2::runtime {

std::string_view to_string(recorded_op op) noexcept {
  // In the enum's order.
  static constexpr std::array<std::string_view, 8> names = {
    "recv_forward", "forward",        "recv_backward",  "backward",
    "optimizer",    "allreduce",      "backward_input", "backward_weight"};
  const auto i = static_cast<std::size_t>(op);
  return i < names.size() ? names[i] : "unknown";
}

} // namespace h2::runtime
