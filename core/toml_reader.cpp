#include "toml_reader.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

namespace h2::detail {

toml::table parse_toml(std::string_view text, const std::string& origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw config_error("", origin + ":" +
                             std::to_string(e.source().begin.line) + ":" +
                             std::to_string(e.source().begin.column) +
                             ": invalid TOML: " + std::string(e.description()));
  }
}

std::string_view toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
    case toml::node_type::time:
    case toml::node_type::date_time:
      return "a date/time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min(
        {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

} // namespace

std::optional<std::string>
closest_key(std::string_view key, const std::set<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = std::max<std::size_t>(2, key.size() / 3) + 1;
  for (const auto& c : candidates) {
    auto d = edit_distance(key, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

int positive_int(table_reader& t, std::string_view key,
                 std::optional<int> fallback, int min, int max) {
  auto v = t.maybe<std::int64_t>(key);
  if (!v) {
    if (fallback)
      return *fallback;
    throw config_error(t.path(key), "missing required key");
  }
  if (*v < min || *v > max)
    throw config_error(t.path(key), "expected an integer " +
                                      (*v < min ? ">= " + std::to_string(min)
                                                : "<= " + std::to_string(max)) +
                                      ", got " + std::to_string(*v));
  return static_cast<int>(*v);
}

double number_in(table_reader& t, std::string_view key, double fallback,
                 double lo, double hi, bool lo_open) {
  auto v = t.maybe<double>(key);
  if (!v)
    return fallback;
  bool ok = std::isfinite(*v) && (lo_open ? *v > lo : *v >= lo) && *v <= hi;
  if (!ok) {
    std::ostringstream msg;
    msg << "expected a number in " << (lo_open ? "(" : "[") << lo << ", " << hi
        << "], got " << *v;
    throw config_error(t.path(key), msg.str());
  }
  return *v;
}

} // namespace h2::detail
