// A one-shot cancellation shared by everything a job runs: once cancelled,
// waits end early and long-running loops stop at their next check. Used for
// the abort of a second SIGINT/SIGTERM.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace h2 {

class cancellation {
public:
  /// Cancels; wakes every wait. Thread-safe, idempotent.
  void cancel() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      cancelled_ = true;
    }
    changed_.notify_all();
  }

  bool cancelled() const {
    std::lock_guard<std::mutex> guard(mutex_);
    return cancelled_;
  }

  /// Waits until `deadline` or the cancellation, whichever comes first.
  /// Returns false when cancelled.
  template <class Clock, class Duration>
  bool wait_until(std::chrono::time_point<Clock, Duration> deadline) const {
    std::unique_lock<std::mutex> lock(mutex_);
    return !changed_.wait_until(lock, deadline, [this] { return cancelled_; });
  }

private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool cancelled_ = false;
};

} // namespace h2
