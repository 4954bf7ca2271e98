// The chip catalog: built-in profiles (core/data/catalog.toml, compiled into
// the library) plus the profiles a job file defines.
#pragma once

#include "h2/core/profile.hpp"

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace h2 {

class catalog {
public:
  /// The built-in catalog, parsed once; thread-safe.
  static const catalog& builtin();

  /// Parses catalog TOML (one table per profile). `origin` names the input
  /// in errors; `key_prefix` is prepended to key paths ("profiles" for the
  /// [profiles.*] tables of a job file). Throws config_error.
  static catalog parse(std::string_view toml_text, const std::string& origin,
                       const std::string& key_prefix = "");

  /// Adds a profile; throws config_error (naming `key_path`) when the name
  /// is already taken.
  void add(chip_profile profile, const std::string& key_path);

  /// The profile called `name`, or nullptr.
  const chip_profile* find(std::string_view name) const;

  /// All names, sorted.
  std::vector<std::string> names() const;

  const std::map<std::string, chip_profile, std::less<>>& profiles() const {
    return profiles_;
  }

private:
  std::map<std::string, chip_profile, std::less<>> profiles_;
};

namespace detail {
class table_reader;
/// Reads one profile table (shared by the catalog and job files).
chip_profile read_profile(table_reader& t, const std::string& name);
} // namespace detail

} // namespace h2
