// What every benchmark shares: result records written as a JSON list of
// {name, value, unit, baseline, ratio} (appended to the file given with
// --out), and small statistics. Benchmarks print ratios against a baseline
// measured in the same run (docs/conventions.md, rule 10).
#pragma once

#include "h2/core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace h2::bench {

struct record {
  std::string name;
  double value = 0;
  std::string unit;
  double baseline = 0;
  double ratio = 0; ///< value / baseline
  std::string note;
};

/// Appends `records` to the JSON list in `path` (created if missing).
inline void append_results(const std::string& path,
                           const std::vector<record>& records) {
  nlohmann::json all = nlohmann::json::array();
  if (std::ifstream in(path); in) {
    try {
      in >> all;
    } catch (const nlohmann::json::exception&) {
      all = nlohmann::json::array();
    }
  }
  for (const auto& r : records)
    all.push_back({{"name", r.name},
                   {"value", r.value},
                   {"unit", r.unit},
                   {"baseline", r.baseline},
                   {"ratio", r.ratio},
                   {"note", r.note}});
  std::ofstream out(path, std::ios::trunc);
  out << all.dump(2) << '\n';
  if (!out)
    throw error("cannot write " + path);
}

/// Prints one record as a table row.
inline void print(const record& r) {
  std::printf("%-48s %12.6g %-8s baseline %12.6g  ratio %.4f  %s\n",
              r.name.c_str(), r.value, r.unit.c_str(), r.baseline, r.ratio,
              r.note.c_str());
}

/// The q-quantile (0..1) of `xs` by nearest rank.
inline double quantile(std::vector<double> xs, double q) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  auto i =
    static_cast<std::size_t>(q * static_cast<double>(xs.size() - 1) + 0.5);
  return xs[std::min(i, xs.size() - 1)];
}

/// The value of `--NAME VALUE` in argv, or "" when absent.
inline std::string flag_value(int argc, char** argv, const std::string& name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == name)
      return argv[i + 1];
  return "";
}

/// `--out FILE` from argv, or "" when absent.
inline std::string out_path(int argc, char** argv) {
  return flag_value(argc, argv, "--out");
}

} // namespace h2::bench
