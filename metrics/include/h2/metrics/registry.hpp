// The metric registry: counters, gauges and histograms, exposed in
// Prometheus' text exposition format 0.0.4 (docs/architecture.md, "Metrics": names start
// with `h2_` and end in a unit suffix, counters in `_total`).
//
// Registration (get_*) takes a mutex; updating a metric is lock-free. Callers
// on a hot path look a metric up once and keep the reference.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace h2::metrics {

/// The labels of one series as (name, value) pairs, exposed in this order.
/// Two label sets that differ only in order name the same series.
using label_set = std::vector<std::pair<std::string, std::string>>;

/// A value that only goes up, e.g. `h2_steps_total`. Lock-free; every
/// member may be called from any thread.
class counter {
public:
  counter() = default;
  counter(const counter&) = delete;
  counter& operator=(const counter&) = delete;

  /// Adds `v`. A negative or NaN `v` is a bug (H2_ENFORCE).
  void inc(double v = 1);

  /// The current value.
  double value() const noexcept {
    return value_.load(std::memory_order_relaxed);
  }

private:
  std::atomic<double> value_{0.0};
};

/// A value that goes up and down, e.g. `h2_memory_used_bytes`. Lock-free;
/// every member may be called from any thread.
class gauge {
public:
  gauge() = default;
  gauge(const gauge&) = delete;
  gauge& operator=(const gauge&) = delete;

  /// Replaces the value.
  void set(double v) noexcept { value_.store(v, std::memory_order_relaxed); }

  /// Adds `v` (which may be negative).
  void inc(double v = 1) noexcept {
    value_.fetch_add(v, std::memory_order_relaxed);
  }

  /// Subtracts `v`.
  void dec(double v = 1) noexcept {
    value_.fetch_sub(v, std::memory_order_relaxed);
  }

  /// The current value.
  double value() const noexcept {
    return value_.load(std::memory_order_relaxed);
  }

private:
  std::atomic<double> value_{0.0};
};

/// A copy of a histogram's state at one moment.
struct histogram_snapshot {
  /// The finite upper bounds, strictly increasing; +Inf is implicit.
  std::vector<double> upper_bounds;
  /// Cumulative counts: element i counts observations <= upper_bounds[i];
  /// the last element (one past upper_bounds) is the +Inf bucket and equals
  /// `count`.
  std::vector<std::uint64_t> cumulative_counts;
  /// Sum of all observations. Read separately from the buckets, so under
  /// concurrent observe() it may include an observation they do not.
  double sum = 0;
  /// Number of observations.
  std::uint64_t count = 0;
};

/// Observations counted into buckets, e.g. `h2_step_seconds`. Lock-free;
/// every member may be called from any thread.
class histogram {
public:
  /// `upper_bounds` must be finite and strictly increasing (a trailing +Inf
  /// is accepted and dropped: the +Inf bucket always exists); otherwise
  /// H2_ENFORCE. An empty list leaves only the +Inf bucket.
  explicit histogram(std::vector<double> upper_bounds);
  histogram(const histogram&) = delete;
  histogram& operator=(const histogram&) = delete;

  /// Counts `v` into the first bucket whose bound is >= v (NaN goes to the
  /// +Inf bucket) and adds it to the sum.
  void observe(double v) noexcept;

  /// The current state, buckets cumulative as Prometheus exposes them.
  histogram_snapshot snapshot() const;

  /// The finite upper bounds this histogram was built with.
  const std::vector<double>& upper_bounds() const noexcept {
    return upper_bounds_;
  }

private:
  std::vector<double> upper_bounds_;
  /// Per-bucket (not cumulative) counts; one more than upper_bounds_.
  std::unique_ptr<std::atomic<std::uint64_t>[]> buckets_;
  std::atomic<double> sum_{0.0};
};

/// Checks and normalises histogram bounds as histogram's constructor does:
/// drops a trailing +Inf; H2_ENFORCE on NaN, infinities elsewhere, or bounds
/// that are not strictly increasing.
std::vector<double> normalize_upper_bounds(std::vector<double> upper_bounds);

/// Formats a sample value as Prometheus parses it: integers plainly ("42"),
/// other finite values in the shortest form that reads back to the same
/// double ("0.1", "1e+20"), and "NaN", "+Inf", "-Inf".
std::string format_value(double v);

/// A set of metric families, each a name with a type, a help text and one
/// series per label set. Thread-safe: every member may be called from any
/// thread. Not copyable or movable, because it hands out references.
///
/// Misuse is a bug, reported by H2_ENFORCE (h2::internal_error): an invalid
/// metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or label name ([a-zA-Z_][a-zA-Z0-9_]*
/// not starting with `__`), the same label twice in one set, a name reused
/// with another type, help text or bucket list, a counter whose name does not
/// end in `_total`, a histogram labelled `le`, or a family whose exposed
/// sample names (`x_bucket`, `x_sum`, `x_count` for a histogram `x`) clash
/// with another family's.
class registry {
public:
  registry();
  ~registry();
  registry(const registry&) = delete;
  registry& operator=(const registry&) = delete;

  /// The counter `name` with `labels`, created at zero on first use. The
  /// reference stays valid for the registry's lifetime.
  counter& get_counter(const std::string& name, const std::string& help,
                       const label_set& labels = {});

  /// The gauge `name` with `labels`, created at zero on first use. The
  /// reference stays valid for the registry's lifetime.
  gauge& get_gauge(const std::string& name, const std::string& help,
                   const label_set& labels = {});

  /// The histogram `name` with `labels`, created empty on first use. Every
  /// series of a family has the same `upper_bounds` (see histogram). The
  /// reference stays valid for the registry's lifetime.
  histogram& get_histogram(const std::string& name, const std::string& help,
                           std::vector<double> upper_bounds,
                           const label_set& labels = {});

  /// All metrics in the Prometheus text format 0.0.4: families sorted by
  /// name, each with `# HELP` and `# TYPE`, series sorted by label set.
  /// Label values and help texts that are not valid UTF-8 have the bad bytes
  /// replaced by U+FFFD, so a scrape never fails on them.
  std::string expose() const;

private:
  struct family;
  enum class metric_type;

  family& find_or_add_family(const std::string& name, const std::string& help,
                             metric_type type,
                             const std::vector<double>* upper_bounds);

  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<family>, std::less<>> families_;
  /// Every exposed sample name, mapped to the family that owns it.
  std::map<std::string, std::string, std::less<>> sample_names_;
};

} // namespace h2::metrics
