#include "h2/metrics/registry.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

namespace h2::metrics {

namespace {

bool is_name_start(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (allow_colon && c == ':');
}

bool is_name_char(char c, bool allow_colon) {
  return is_name_start(c, allow_colon) || (c >= '0' && c <= '9');
}

bool valid_name(const std::string& name, bool allow_colon) {
  if (name.empty() || !is_name_start(name[0], allow_colon))
    return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [&](char c) { return is_name_char(c, allow_colon); });
}

bool valid_metric_name(const std::string& name) {
  return valid_name(name, true);
}

bool valid_label_name(const std::string& name) {
  return valid_name(name, false) && name.rfind("__", 0) != 0;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Appends `text` to `out`, replacing every byte that is not part of a
/// well-formed UTF-8 sequence with U+FFFD; Prometheus rejects a scrape with
/// invalid UTF-8 in a label value.
void append_utf8(std::string& out, std::string_view text) {
  static constexpr std::string_view replacement = "\xEF\xBF\xBD";
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    // Length of the sequence and the valid range of its second byte
    // (excludes overlong forms, surrogates and code points > U+10FFFF).
    std::size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0)
        lo = 0xA0;
      if (c == 0xED)
        hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0)
        lo = 0x90;
      if (c == 0xF4)
        hi = 0x8F;
    }
    bool ok = len != 0 && i + len <= n && p[i + 1] >= lo && p[i + 1] <= hi;
    for (std::size_t k = 2; ok && k < len; ++k)
      ok = p[i + k] >= 0x80 && p[i + k] <= 0xBF;
    if (ok) {
      out.append(text.data() + i, len);
      i += len;
    } else {
      out += replacement;
      ++i;
    }
  }
}

/// `# HELP` text: backslash and newline escaped.
void append_help(std::string& out, std::string_view help) {
  std::string valid;
  append_utf8(valid, help);
  for (char c : valid) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
}

/// A label value: backslash, double quote and newline escaped.
void append_label_value(std::string& out, std::string_view value) {
  std::string valid;
  append_utf8(valid, value);
  for (char c : valid) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
}

/// `{a="x",b="y"}`, with `le` appended when `le` is non-null; nothing for an
/// empty set.
void append_labels(std::string& out, const label_set& labels,
                   const std::string* le = nullptr) {
  if (labels.empty() && le == nullptr)
    return;
  out += '{';
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first)
      out += ',';
    first = false;
    out += name;
    out += "=\"";
    append_label_value(out, value);
    out += '"';
  }
  if (le != nullptr) {
    if (!first)
      out += ',';
    out += "le=\"";
    out += *le;
    out += '"';
  }
  out += '}';
}

/// `labels` sorted by name: the key of a series. Checks the label names
/// first, so that a bad call changes nothing.
label_set series_key(const std::string& metric, const label_set& labels,
                     bool histogram) {
  label_set key = labels;
  std::sort(key.begin(), key.end());
  for (std::size_t i = 0; i < key.size(); ++i) {
    H2_ENFORCE(valid_label_name(key[i].first), "metric ", metric,
               ": invalid label name '", key[i].first, "'");
    H2_ENFORCE(i == 0 || key[i - 1].first != key[i].first, "metric ", metric,
               ": label '", key[i].first, "' given twice");
    H2_ENFORCE(!histogram || key[i].first != "le", "histogram ", metric,
               ": label 'le' is reserved for buckets");
  }
  return key;
}

void append_sample(std::string& out, const std::string& name,
                   std::string_view suffix, const label_set& labels,
                   double value, const std::string* le = nullptr) {
  out += name;
  out += suffix;
  append_labels(out, labels, le);
  out += ' ';
  out += format_value(value);
  out += '\n';
}

} // namespace

// -- counter, histogram -------------------------------------------------------

void counter::inc(double v) {
  H2_ENFORCE(v >= 0, "a counter only goes up; inc(", v, ")");
  value_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<double> normalize_upper_bounds(std::vector<double> upper_bounds) {
  if (!upper_bounds.empty() && upper_bounds.back() > 0 &&
      std::isinf(upper_bounds.back()))
    upper_bounds.pop_back();
  for (std::size_t i = 0; i < upper_bounds.size(); ++i) {
    H2_ENFORCE(std::isfinite(upper_bounds[i]), "bucket bound ", i, " is ",
               upper_bounds[i]);
    H2_ENFORCE(i == 0 || upper_bounds[i - 1] < upper_bounds[i],
               "bucket bounds must increase strictly: ", upper_bounds[i - 1],
               " then ", upper_bounds[i]);
  }
  return upper_bounds;
}

histogram::histogram(std::vector<double> upper_bounds)
    : upper_bounds_(normalize_upper_bounds(std::move(upper_bounds))),
      buckets_(std::make_unique<std::atomic<std::uint64_t>[]>(
        upper_bounds_.size() + 1)) {
}

void histogram::observe(double v) noexcept {
  // NaN compares false with every bound and so lands in the +Inf bucket.
  auto it = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), v);
  if (std::isnan(v))
    it = upper_bounds_.end();
  buckets_[it - upper_bounds_.begin()].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

histogram_snapshot histogram::snapshot() const {
  histogram_snapshot s;
  s.upper_bounds = upper_bounds_;
  s.cumulative_counts.resize(upper_bounds_.size() + 1);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i <= upper_bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative_counts[i] = total;
  }
  // The count is the sum of the buckets, so `_count` always equals the +Inf
  // bucket, as Prometheus expects, even while other threads observe.
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::string format_value(double v) {
  if (std::isnan(v))
    return "NaN";
  if (std::isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  // Integers below 1e15 are exact in a double and read best without an
  // exponent ("1000000", not "1e+06").
  if (v == std::trunc(v) && std::fabs(v) < 1e15)
    return std::to_string(static_cast<long long>(v));
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), v);
  H2_ENFORCE(result.ec == std::errc{}, "to_chars failed for ", v);
  return std::string(buf, result.ptr);
}

// -- registry -----------------------------------------------------------------

enum class registry::metric_type { counter, gauge, histogram };

struct registry::family {
  /// One label set's metric; exactly one pointer is set, per the family type.
  struct series {
    label_set labels; ///< as first registered, the exposed order
    std::unique_ptr<counter> counter_metric;
    std::unique_ptr<gauge> gauge_metric;
    std::unique_ptr<histogram> histogram_metric;
  };

  std::string name;
  std::string help;
  metric_type type;
  std::vector<double> upper_bounds; ///< histograms only, normalised
  /// Keyed by the label set sorted by label name, so that order does not
  /// make two series of one label set.
  std::map<label_set, series> series_by_labels;

  /// The series of `labels` (whose sorted form is `key`), created without a
  /// metric on first use.
  series& find_or_add_series(label_set key, const label_set& labels) {
    auto [it, added] = series_by_labels.try_emplace(std::move(key));
    if (added)
      it->second.labels = labels;
    return it->second;
  }
};

namespace {

std::string_view type_name(int type) {
  static constexpr std::string_view names[] = {"counter", "gauge", "histogram"};
  return names[type];
}

} // namespace

registry::registry() = default;
registry::~registry() = default;

registry::family&
registry::find_or_add_family(const std::string& name, const std::string& help,
                             metric_type type,
                             const std::vector<double>* upper_bounds) {
  auto it = families_.find(name);
  if (it != families_.end()) {
    family& f = *it->second;
    H2_ENFORCE(f.type == type, "metric ", name, " is a ",
               type_name(static_cast<int>(f.type)), ", not a ",
               type_name(static_cast<int>(type)));
    H2_ENFORCE(f.help == help, "metric ", name, " registered with help '",
               f.help, "', now '", help, "'");
    H2_ENFORCE(upper_bounds == nullptr || f.upper_bounds == *upper_bounds,
               "histogram ", name, " registered with other bucket bounds");
    return f;
  }
  H2_ENFORCE(valid_metric_name(name), "invalid metric name '", name, "'");
  std::vector<std::string> samples;
  if (type == metric_type::histogram)
    samples = {name + "_bucket", name + "_count", name + "_sum"};
  else
    samples = {name};
  for (const auto& sample : samples) {
    auto owner = sample_names_.find(sample);
    H2_ENFORCE(owner == sample_names_.end(), "metric ", name, " would expose ",
               sample, ", which metric ", owner->second, " exposes already");
  }
  for (auto& sample : samples)
    sample_names_.emplace(std::move(sample), name);
  auto f = std::make_unique<family>();
  f->name = name;
  f->help = help;
  f->type = type;
  if (upper_bounds != nullptr)
    f->upper_bounds = *upper_bounds;
  return *families_.emplace(name, std::move(f)).first->second;
}

counter& registry::get_counter(const std::string& name, const std::string& help,
                               const label_set& labels) {
  H2_ENFORCE(ends_with(name, "_total"), "counter name '", name,
             "' must end in _total");
  auto key = series_key(name, labels, false);
  std::lock_guard lock(mutex_);
  auto& s = find_or_add_family(name, help, metric_type::counter, nullptr)
              .find_or_add_series(std::move(key), labels);
  if (!s.counter_metric)
    s.counter_metric = std::make_unique<counter>();
  return *s.counter_metric;
}

gauge& registry::get_gauge(const std::string& name, const std::string& help,
                           const label_set& labels) {
  auto key = series_key(name, labels, false);
  std::lock_guard lock(mutex_);
  auto& s = find_or_add_family(name, help, metric_type::gauge, nullptr)
              .find_or_add_series(std::move(key), labels);
  if (!s.gauge_metric)
    s.gauge_metric = std::make_unique<gauge>();
  return *s.gauge_metric;
}

histogram& registry::get_histogram(const std::string& name,
                                   const std::string& help,
                                   std::vector<double> upper_bounds,
                                   const label_set& labels) {
  auto bounds = normalize_upper_bounds(std::move(upper_bounds));
  auto key = series_key(name, labels, true);
  std::lock_guard lock(mutex_);
  auto& s = find_or_add_family(name, help, metric_type::histogram, &bounds)
              .find_or_add_series(std::move(key), labels);
  if (!s.histogram_metric)
    s.histogram_metric = std::make_unique<histogram>(std::move(bounds));
  return *s.histogram_metric;
}

std::string registry::expose() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& [name, f] : families_) {
    out += "# HELP ";
    out += name;
    out += ' ';
    append_help(out, f->help);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type_name(static_cast<int>(f->type));
    out += '\n';
    for (const auto& [key, s] : f->series_by_labels) {
      switch (f->type) {
        case metric_type::counter:
          append_sample(out, name, "", s.labels, s.counter_metric->value());
          break;
        case metric_type::gauge:
          append_sample(out, name, "", s.labels, s.gauge_metric->value());
          break;
        case metric_type::histogram: {
          auto snap = s.histogram_metric->snapshot();
          for (std::size_t i = 0; i < snap.cumulative_counts.size(); ++i) {
            std::string le = i < snap.upper_bounds.size()
                               ? format_value(snap.upper_bounds[i])
                               : std::string("+Inf");
            append_sample(out, name, "_bucket", s.labels,
                          static_cast<double>(snap.cumulative_counts[i]), &le);
          }
          append_sample(out, name, "_sum", s.labels, snap.sum);
          append_sample(out, name, "_count", s.labels,
                        static_cast<double>(snap.count));
          break;
        }
      }
    }
  }
  return out;
}

} // namespace h2::metrics
