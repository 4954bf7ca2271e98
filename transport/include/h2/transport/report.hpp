// How transport components that run on threads of their own (listeners,
// handshakes) say what they refused or could not do, without flooding the
// log while an attack or an exhaustion lasts (docs/transport.md, Bounds).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace h2::transport {

/// Takes one line without its newline. An empty sink reports nothing.
using log_sink = std::function<void(const std::string&)>;

/// Passes a recurring condition to a sink at most once per interval: the
/// first occurrence at once, later ones folded into the next line as a
/// count ("... (17 more since the last report)"). Thread-safe.
class throttled_report {
public:
  explicit throttled_report(log_sink sink, std::chrono::milliseconds interval =
                                             std::chrono::seconds(10));

  /// Reports `line` now, or counts it when a line went out less than the
  /// interval ago.
  void operator()(const std::string& line);

  /// Occurrences so far, reported or folded.
  std::uint64_t count() const;

private:
  log_sink sink_;
  std::chrono::milliseconds interval_;
  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point last_{};
  std::uint64_t folded_ = 0;
  std::uint64_t count_ = 0;
  bool reported_ = false;
};

} // namespace h2::transport
