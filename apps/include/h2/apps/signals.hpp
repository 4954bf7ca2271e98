// Clean stops on SIGINT/SIGTERM: the first signal asks the run to stop at
// the next step boundary, the second aborts the step in flight. Signals are
// taken by a dedicated thread (sigwait), never by an async handler.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
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

  /// While it lives, a second signal also calls `on_abort` (on the
  /// watcher's thread): how what is made after the watcher, a node, gets
  /// aborted. Its end waits for a call in progress, so declared after what
  /// it aborts, it ends first and nothing is called on a dead object.
  class abort_scope {
  public:
    abort_scope(signal_watcher& watcher, std::function<void()> on_abort);
    ~abort_scope();
    abort_scope(const abort_scope&) = delete;
    abort_scope& operator=(const abort_scope&) = delete;

  private:
    signal_watcher& watcher_;
  };
  [[nodiscard]] std::unique_ptr<abort_scope>
  aborting(std::function<void()> on_abort) {
    return std::make_unique<abort_scope>(*this, std::move(on_abort));
  }

  /// While it lives, a second signal ends the process at once with
  /// exit_signal_base + the signal, after one line naming `program`: the
  /// set-up before a run (reading the job, planning, reading a checkpoint
  /// to resume) has no step boundary to stop at and nothing to abort. A
  /// first signal stays a stop request, which the run honours at its
  /// first boundary. Reset it before the run's own aborting() scope.
  [[nodiscard]] std::unique_ptr<abort_scope> exiting(std::string program);

private:
  std::shared_ptr<std::atomic<int>> stop_;
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::function<void()> on_abort_;
  std::mutex scoped_mutex_; ///< held while scoped_abort_ runs
  std::function<void()> scoped_abort_;
  bool announce_;
  std::thread thread_;
};

/// An h2-node started by h2-launch --nodes ends when its launcher is gone,
/// by any signal, SIGKILL included (docs/cli.md, "Several processes"). A
/// thread polls getppid() every 50 ms (a node whose launcher died is
/// reparented); then it removes the launcher's temporary directory (the
/// secret the launcher wrote), raises SIGTERM (the signal_watcher stops the
/// run at the next step boundary) and, if the process still runs
/// `grace` later, ends it with exit_signal_base + SIGTERM. SIGPIPE is
/// ignored from the start, so that writing to the dead launcher's pipes
/// does not kill the node before it has cleaned up.
class launcher_watch {
public:
  /// `temp_dir` is removed only when it is a directory of this user named
  /// /tmp/h2-launch-* (what h2-launch creates); "" for none.
  launcher_watch(pid_t launcher, std::string temp_dir,
                 std::chrono::milliseconds grace = default_grace);
  ~launcher_watch();

  launcher_watch(const launcher_watch&) = delete;
  launcher_watch& operator=(const launcher_watch&) = delete;

  static constexpr std::chrono::milliseconds default_grace{1500};

private:
  void on_orphaned(const std::string& temp_dir,
                   std::chrono::milliseconds grace);

  std::atomic<bool> done_{false};
  std::thread thread_;
};

} // namespace h2::apps
