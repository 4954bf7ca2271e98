#include "h2/core/chip_id.hpp"

#include <charconv>

namespace h2 {

std::string chip_id::to_string() const {
  return std::to_string(node) + ":" + std::to_string(index);
}

std::optional<chip_id> chip_id::parse(std::string_view text) {
  auto colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
    return std::nullopt;
  auto parse_int = [](std::string_view s, int& out) {
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc{} && ptr == s.data() + s.size() && out >= 0;
  };
  chip_id id;
  if (!parse_int(text.substr(0, colon), id.node) ||
      !parse_int(text.substr(colon + 1), id.index))
    return std::nullopt;
  return id;
}

} // namespace h2
