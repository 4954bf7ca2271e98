// The one name of a chip: "<node-rank>:<local-index>" (docs/architecture.md).
#pragma once

#include <compare>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace h2 {

/// Identifies a chip in plans, metrics labels, logs and admin commands.
struct chip_id {
  int node = 0;  ///< rank of the h2-node process holding the chip
  int index = 0; ///< position of the chip among its node's chips

  auto operator<=>(const chip_id&) const = default;

  /// "0:1".
  std::string to_string() const;

  /// Parses "<node>:<index>" with non-negative integers; nullopt otherwise.
  static std::optional<chip_id> parse(std::string_view text);
};

} // namespace h2

template <>
struct std::hash<h2::chip_id> {
  std::size_t operator()(const h2::chip_id& id) const noexcept {
    return std::hash<long long>{}((static_cast<long long>(id.node) << 32) ^
                                  id.index);
  }
};
