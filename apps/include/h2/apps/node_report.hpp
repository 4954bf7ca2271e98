// The structured channel from an h2-node to the h2-launch --nodes that
// started it (docs/cli.md, "Several processes"): one JSON object per line
// on a pipe the launcher hands over as --report-fd, instead of patterns in
// the node's output. What a node tells: where it listens (the coordinator,
// its metrics, the admin endpoint) and the state it is in.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace h2::apps {

/// A node's side: writes events to `fd` (-1: nowhere). Thread-safe; a
/// launcher gone (EPIPE) is ignored.
class node_report {
public:
  explicit node_report(int fd = -1) : fd_(fd) {}
  ~node_report();
  node_report(const node_report&) = delete;
  node_report& operator=(const node_report&) = delete;

  /// {"event":"listening","service":"coordinator","address":"HOST:PORT"}
  /// (services: coordinator, metrics, admin).
  void listening(std::string_view service, std::string_view host, int port);

  /// {"event":"state","state":"running"} (states: starting, while it
  /// reads the job, checks its chips and plans; running, once it joins
  /// and trains).
  void state(std::string_view state);

private:
  void write_line(const std::string& line);

  int fd_;
  std::mutex mutex_;
};

/// One event as the launcher reads it.
struct node_event {
  std::string event;   ///< "listening" or "state"
  std::string service; ///< listening
  std::string address; ///< listening: HOST:PORT
  std::string state;   ///< state
};

/// The event on one line; nullopt for anything else (a node's channel is
/// trusted no more than its output).
std::optional<node_event> parse_node_event(std::string_view line);

} // namespace h2::apps
