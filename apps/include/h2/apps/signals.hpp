// Clean stops on SIGINT/SIGTERM: the first signal asks the run to stop at
// the next step boundary, the second aborts the step in flight. Signals are
// taken by a dedicated thread (sigwait), never by an async handler.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

namespace h2::apps {

/// Blocks SIGINT and SIGTERM in the calling thread; call first thing in
/// main(), before any other thread starts, so every thread inherits it.
void block_stop_signals();

class signal_watcher {
public:
  /// Starts watching. `on_abort` runs (on the watcher's thread) when the
  /// second signal arrives; `announce` prints what will happen.
  signal_watcher(std::function<void()> on_abort, bool announce = true);
  ~signal_watcher();

  signal_watcher(const signal_watcher&) = delete;
  signal_watcher& operator=(const signal_watcher&) = delete;

  /// Non-zero once a stop was requested (the count of signals).
  const std::shared_ptr<std::atomic<int>>& stop_flag() const noexcept {
    return stop_;
  }

  /// The last signal received (0: none).
  int signal() const noexcept { return signal_.load(); }

private:
  std::shared_ptr<std::atomic<int>> stop_;
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::function<void()> on_abort_;
  bool announce_;
  std::thread thread_;
};

} // namespace h2::apps
