// Reads a TOML table with key paths in every error, and rejects keys nobody
// asked for. Private to core/ (job files and the chip catalog).
#pragma once

#include "h2/core/error.hpp"

#include <toml++/toml.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace h2::detail {

/// Parses TOML text; a syntax error becomes a config_error (no key path)
/// whose message names `origin`, the line and the column.
toml::table parse_toml(std::string_view text, const std::string& origin);

/// "an integer", "a string", ... for error messages.
std::string_view toml_type_name(const toml::node& node);

/// The closest of `candidates` to `key` when it looks like a typo.
std::optional<std::string> closest_key(std::string_view key,
                                       const std::set<std::string>& candidates);

/// Converts one TOML value to T or throws config_error naming `path`.
/// T is one of bool, std::int64_t, double (integers accepted), std::string.
template <class T>
T toml_value(const toml::node& node, const std::string& path) {
  if constexpr (std::is_same_v<T, double>) {
    if (auto v = node.value_exact<double>())
      return *v;
    if (auto v = node.value_exact<std::int64_t>())
      return static_cast<double>(*v);
    throw config_error(path, std::string("expected a number, got ") +
                               std::string(toml_type_name(node)));
  } else {
    if (auto v = node.value_exact<T>())
      return *v;
    std::string_view want = std::is_same_v<T, bool>           ? "a boolean"
                            : std::is_same_v<T, std::int64_t> ? "an integer"
                                                              : "a string";
    throw config_error(path, std::string("expected ") + std::string(want) +
                               ", got " + std::string(toml_type_name(node)));
  }
}

/// A view of one table that remembers which keys were read.
class table_reader {
public:
  /// `path` is the key path of the table itself ("" for the root).
  table_reader(const toml::table& table, std::string path)
      : table_(&table), path_(std::move(path)) {}

  /// The key path of `key` inside this table.
  std::string path(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  const std::string& path() const noexcept { return path_; }

  bool has(std::string_view key) const { return table_->contains(key); }

  template <class T>
  std::optional<T> maybe(std::string_view key) {
    used_.emplace(key);
    const toml::node* node = table_->get(key);
    if (node == nullptr)
      return std::nullopt;
    return toml_value<T>(*node, path(key));
  }

  template <class T>
  T required(std::string_view key) {
    if (auto v = maybe<T>(key))
      return *v;
    throw config_error(path(key), "missing required key");
  }

  template <class T>
  T optional(std::string_view key, T fallback) {
    if (auto v = maybe<T>(key))
      return *v;
    return fallback;
  }

  /// A sub-table; nullopt when absent, config_error when not a table.
  std::optional<table_reader> maybe_table(std::string_view key) {
    used_.emplace(key);
    const toml::node* node = table_->get(key);
    if (node == nullptr)
      return std::nullopt;
    if (!node->is_table())
      throw config_error(path(key), std::string("expected a table, got ") +
                                      std::string(toml_type_name(*node)));
    return table_reader(*node->as_table(), path(key));
  }

  table_reader required_table(std::string_view key) {
    if (auto t = maybe_table(key))
      return *t;
    throw config_error(path(key), "missing required table [" + path(key) + "]");
  }

  /// An array; nullptr when absent, config_error when not an array.
  const toml::array* maybe_array(std::string_view key) {
    used_.emplace(key);
    const toml::node* node = table_->get(key);
    if (node == nullptr)
      return nullptr;
    if (!node->is_array())
      throw config_error(path(key), std::string("expected an array, got ") +
                                      std::string(toml_type_name(*node)));
    return node->as_array();
  }

  /// Marks every key as read (for tables whose keys are names, such as the
  /// catalog's profile names).
  void mark_all_used() {
    for (auto&& [k, v] : *table_)
      used_.emplace(k.str());
  }

  const toml::table& table() const noexcept { return *table_; }

  /// Throws config_error for the first key that nobody read.
  void finish() const {
    for (auto&& [k, v] : *table_) {
      std::string key(k.str());
      if (used_.count(key) != 0)
        continue;
      std::string msg = "unknown key";
      if (auto near = closest_key(key, used_))
        msg += " (did you mean '" + *near + "'?)";
      throw config_error(path(key), msg);
    }
  }

private:
  const toml::table* table_;
  std::string path_;
  std::set<std::string> used_;
};

/// The integer at `key`, in [min, max]; `fallback` when absent (else
/// "missing required key").
int positive_int(table_reader& t, std::string_view key,
                 std::optional<int> fallback = std::nullopt, int min = 1,
                 int max = 1 << 30);

/// The finite number at `key`, in [lo, hi] ((lo, hi] when `lo_open`);
/// `fallback` when absent.
double number_in(table_reader& t, std::string_view key, double fallback,
                 double lo, double hi, bool lo_open = false);

/// The string at `key` as an enumerator through `parse` (which returns an
/// optional); `fallback` when absent, else a config_error listing `choices`.
template <class Enum, class Parse>
Enum enum_value(table_reader& t, std::string_view key, Enum fallback,
                std::string_view choices, Parse parse) {
  auto v = t.maybe<std::string>(key);
  if (!v)
    return fallback;
  if (auto e = parse(*v))
    return *e;
  throw config_error(t.path(key), "expected one of " + std::string(choices) +
                                    ", got \"" + *v + "\"");
}

} // namespace h2::detail
