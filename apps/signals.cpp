#include "h2/apps/signals.hpp"

#include "h2/apps/exit_codes.hpp"
#include "h2/core/files.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace h2::apps {

namespace {

/// Whether `dir` is what h2-launch's temp_dir creates: /tmp/h2-launch-*,
/// a directory (not a link) of this user.
bool is_launcher_dir(const std::string& dir) {
  static const std::string prefix = "/tmp/h2-launch-";
  if (dir.size() <= prefix.size() ||
      dir.compare(0, prefix.size(), prefix) != 0 ||
      dir.find('/', prefix.size()) != std::string::npos)
    return false;
  struct stat st {};
  return ::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         st.st_uid == ::geteuid();
}

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

std::unique_ptr<signal_watcher::abort_scope>
signal_watcher::exiting(std::string program) {
  return aborting([this, program = std::move(program)] {
    std::fprintf(stderr, "%s: aborted by signal %d while setting up\n",
                 program.c_str(), signal());
    std::fflush(nullptr);
    std::_Exit(exit_signal_base + signal());
  });
}

signal_watcher::~signal_watcher() {
  done_.store(true);
  if (thread_.joinable())
    thread_.join();
}

launcher_watch::launcher_watch(pid_t launcher, std::string temp_dir,
                               std::chrono::milliseconds grace) {
  std::signal(SIGPIPE, SIG_IGN);
  thread_ = std::thread([this, launcher, dir = std::move(temp_dir), grace] {
    while (!done_.load()) {
      if (::getppid() != launcher) {
        on_orphaned(dir, grace);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
}

void launcher_watch::on_orphaned(const std::string& temp_dir,
                                 std::chrono::milliseconds grace) {
  if (is_launcher_dir(temp_dir))
    h2::remove_tree(temp_dir); // another node may have removed it first
  ::kill(::getpid(), SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (!done_.load()) {
    if (std::chrono::steady_clock::now() >= deadline)
      std::_Exit(exit_signal_base + SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

launcher_watch::~launcher_watch() {
  done_.store(true);
  if (thread_.joinable())
    thread_.join();
}

} // namespace h2::apps
