#include "h2/apps/signals.hpp"

#include <csignal>
#include <cstdio>
#include <ctime>

namespace h2::apps {

namespace {

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

} // namespace

void block_stop_signals() {
  sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

signal_watcher::signal_watcher(std::function<void()> on_abort, bool announce)
    : stop_(std::make_shared<std::atomic<int>>(0)),
      on_abort_(std::move(on_abort)),
      announce_(announce) {
  thread_ = std::thread([this] {
    sigset_t set = stop_signals();
    // Polls so the destructor can end the thread without a signal of its own.
    timespec tick{0, 100'000'000};
    while (!done_.load()) {
      int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig <= 0)
        continue;
      signal_.store(sig);
      int count = ++*stop_;
      const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
      if (count == 1) {
        if (announce_)
          std::fprintf(stderr,
                       "\n%s: stopping at the next step boundary (send it "
                       "again to abort now)\n",
                       name);
      } else {
        if (announce_)
          std::fprintf(stderr, "\n%s again: aborting the step in flight\n",
                       name);
        if (on_abort_)
          on_abort_();
        std::lock_guard<std::mutex> guard(scoped_mutex_);
        if (scoped_abort_)
          scoped_abort_();
      }
    }
  });
}

signal_watcher::abort_scope::abort_scope(signal_watcher& watcher,
                                         std::function<void()> on_abort)
    : watcher_(watcher) {
  std::lock_guard<std::mutex> guard(watcher_.scoped_mutex_);
  watcher_.scoped_abort_ = std::move(on_abort);
}

signal_watcher::abort_scope::~abort_scope() {
  std::lock_guard<std::mutex> guard(watcher_.scoped_mutex_);
  watcher_.scoped_abort_ = nullptr;
}

signal_watcher::~signal_watcher() {
  done_.store(true);
  if (thread_.joinable())
    thread_.join();
}

} // namespace h2::apps
