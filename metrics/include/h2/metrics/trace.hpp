// Traces in the Chrome trace event format (JSON object form), which
// chrome://tracing and ui.perfetto.dev open: one complete event per operation
// a chip ran, named processes (nodes) and threads (chips, streams).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace h2::metrics {

/// Collects trace events in memory and writes them as
/// `{"traceEvents":[...],"displayTimeUnit":"ms"}`. Times are given in seconds
/// from any fixed origin (the job's start, say) and written in microseconds.
/// Thread-safe: every member may be called from any thread. Events are kept
/// in the order they were added, until the writer is destroyed.
///
/// Strings that are not valid UTF-8 have the bad bytes replaced by U+FFFD.
class trace_writer {
public:
  trace_writer() = default;
  trace_writer(const trace_writer&) = delete;
  trace_writer& operator=(const trace_writer&) = delete;

  /// Adds a complete event (ph "X"): `name` in `category` ran on thread
  /// `tid` of process `pid` from `start_seconds` for `duration_seconds`.
  /// `args` is null (none) or a JSON object shown with the event. A
  /// non-finite time, a negative duration or `args` of another kind is a bug
  /// (H2_ENFORCE).
  void complete(std::string name, std::string category, int pid, int tid,
                double start_seconds, double duration_seconds,
                nlohmann::json args = {});

  /// Names process `pid` (a metadata event, ph "M", "process_name").
  void name_process(int pid, std::string name);

  /// Names thread `tid` of process `pid` (ph "M", "thread_name").
  void name_thread(int pid, int tid, std::string name);

  /// Adds a counter event (ph "C"): at `time_seconds`, counter `name` of
  /// process `pid` has the series in `values`, a JSON object of numbers such
  /// as {"used_bytes": 1.5e9}. Other `values` or a non-finite time is a bug
  /// (H2_ENFORCE).
  void counter(std::string name, int pid, double time_seconds,
               nlohmann::json values);

  /// Number of events added so far, metadata included.
  std::size_t size() const;

  /// The whole trace as JSON text, one event per line.
  std::string to_string() const;

  /// Writes to_string() to `path`, replacing the file. Throws h2::error
  /// naming the path when it cannot be written.
  void write(const std::string& path) const;

private:
  /// Adds one event, serialised outside the lock.
  void add(const nlohmann::json& event);

  mutable std::mutex mutex_;
  std::vector<std::string> events_; ///< each a serialised JSON object
};

} // namespace h2::metrics
