// The progress watchdog (docs/cli.md, "Stalled chips"): heartbeats come from
// a thread that keeps beating while a chip's compute hangs, so each chip's
// worker publishes the op it is in (chip_progress) and a watchdog compares
// how long that op has run with its prediction. A chip whose op has run
// longer than factor x its predicted time and longer than the floor is
// stalled. Pure but for the thread of watchdog_thread: the clock is a
// parameter, so tests step it by hand.
#pragma once

#include "h2/core/chip_id.hpp"
#include "h2/core/error.hpp"
#include "h2/core/job.hpp"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace h2::runtime {

/// A chip's op was given up on by the watchdog; the message is the
/// stall's (stall::message).
class stalled_error : public error {
public:
  using error::error;
};

using watchdog_clock = std::chrono::steady_clock;

/// What one chip is doing now: written by its worker thread, read by the
/// watchdog's. Thread-safe.
class chip_progress {
public:
  /// The worker starts `op` ("forward", "backward", "optimizer") of
  /// `micro_batch` (-1: none), predicted to take `predicted_seconds`
  /// (negative: no prediction; then the op's last duration on this chip
  /// stands in, else only the floor counts), at `now`.
  void begin(const char* op, int micro_batch, double predicted_seconds,
             watchdog_clock::time_point now);
  /// The op started last ended at `now`.
  void end(watchdog_clock::time_point now);

  struct snapshot {
    bool busy = false;
    const char* op = "";
    int micro_batch = -1;
    double predicted_seconds = -1; ///< after the fallback of begin()
    watchdog_clock::time_point started{};
  };
  snapshot read() const;

  /// Why the watchdog gave up on this chip ("" while it has not): the
  /// worker's op that ends by the job's cancellation reports this instead.
  std::string stalled() const;
  void set_stalled(const std::string& why);

private:
  mutable std::mutex mutex_;
  snapshot now_;
  std::map<std::string, double> last_seconds_; ///< by op
  std::string stalled_;
};

/// A chip found stalled.
struct stall {
  chip_id chip;
  std::string op;
  int micro_batch = -1;
  double ran_seconds = 0;
  double predicted_seconds = -1;
  double limit_seconds = 0; ///< max(factor x predicted, floor)
  bool floor_bound = true;  ///< the floor was the larger

  /// "chip 0:1 stalled: its backward of micro-batch 3 has run 75.0 s, 20 x
  /// its predicted 0.052 s and past the 60 s floor (watchdog.factor,
  /// watchdog.floor_seconds)".
  std::string message() const;
};

/// The chips of one process and the rule that judges them.
class progress_watchdog {
public:
  explicit progress_watchdog(watchdog_config config);

  /// The progress record of `chip` (made on first use, kept for the run:
  /// a live re-plan's new worker writes the same one).
  std::shared_ptr<chip_progress> watch(const chip_id& chip);

  /// While suspended (a rebalance, a pause, a checkpoint wait), nothing is
  /// stalled; on resume, ops in progress count from the resume. Nested
  /// suspensions count.
  void suspend();
  void resume(watchdog_clock::time_point now);

  /// The chips stalled at `now`, in chip order.
  std::vector<stall> check(watchdog_clock::time_point now) const;

  const watchdog_config& config() const noexcept { return config_; }

private:
  watchdog_config config_;
  mutable std::mutex mutex_;
  std::map<chip_id, std::shared_ptr<chip_progress>> chips_;
  int suspended_ = 0;
  watchdog_clock::time_point resumed_{};
};

/// What a process does when a stalled chip's op still has not ended long
/// after the watchdog gave up on it (a kernel that ignores the abort): says
/// so on stderr and exits at once with code 1, training failed (docs/
/// cli.md, "Stalled chips"), rather than hang until
/// runtime.step_timeout_seconds.
[[noreturn]] void exit_stuck(const stall& s);

/// Checks a watchdog every `interval` on a thread of its own, from
/// construction to destruction. At the first stall it marks the chip's
/// progress stalled, keeps the stall (stalled()) and calls `on_stall` once
/// (the caller aborts the run); when the process is still running `grace`
/// later (an op that cannot be interrupted), it calls `on_stuck`.
class watchdog_thread {
public:
  watchdog_thread(std::shared_ptr<progress_watchdog> watchdog,
                  std::function<void(const stall&)> on_stall,
                  std::function<void(const stall&)> on_stuck = exit_stuck,
                  std::chrono::milliseconds interval =
                    std::chrono::milliseconds(250),
                  std::chrono::seconds grace = std::chrono::seconds(30));
  ~watchdog_thread();

  watchdog_thread(const watchdog_thread&) = delete;
  watchdog_thread& operator=(const watchdog_thread&) = delete;

  /// The stall found, if any: whatever the chips answered after it, the
  /// cause a failed run reports.
  std::optional<stall> stalled() const;

private:
  void run();

  std::shared_ptr<progress_watchdog> watchdog_;
  std::function<void(const stall&)> on_stall_, on_stuck_;
  std::chrono::milliseconds interval_;
  std::chrono::seconds grace_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::optional<stall> found_;
  std::thread thread_;
};

} // namespace h2::runtime
