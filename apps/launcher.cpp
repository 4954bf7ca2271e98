#include "h2/apps/launcher.hpp"

#include "h2/apps/exit_codes.hpp"
#include "h2/apps/signals.hpp"
#include "h2/core/error.hpp"
#include "h2/core/random.hpp"

#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;

namespace h2::apps {

std::string sibling_binary(const std::string& name) {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    return name;
  return (self.parent_path() / name).string();
}

namespace {

/// One h2-node child with its output piped to us.
struct child {
  int rank = 0;
  pid_t pid = -1;
  int out = -1; ///< read end of its stdout
  int err = -1; ///< read end of its stderr
  std::thread out_reader, err_reader;
  int status = 0;
  bool killed = false; ///< by us, after a failure elsewhere
};

/// How long the other nodes have to end once one failed.
constexpr std::chrono::seconds failure_grace{8};

/// Writes whole lines to our stdout/stderr, never interleaved mid-line.
std::mutex output_mutex;

void relay(int fd, FILE* to, const std::string& prefix,
           const std::function<void(const std::string&)>& on_line) {
  std::string pending;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0)
      break;
    pending.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (on_line)
        on_line(line);
      std::lock_guard<std::mutex> guard(output_mutex);
      std::fprintf(to, "%s%s\n", prefix.c_str(), line.c_str());
      std::fflush(to);
    }
  }
  if (!pending.empty()) {
    std::lock_guard<std::mutex> guard(output_mutex);
    std::fprintf(to, "%s%s\n", prefix.c_str(), pending.c_str());
  }
  ::close(fd);
}

void spawn(child& c, const std::vector<std::string>& args,
           const std::function<void(const std::string&)>& on_line) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw error(std::string("cannot create pipes: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Children take signals normally (we block them in this process); we
  // forward ours to them.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> argv;
  for (const auto& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int rc =
    posix_spawn(&c.pid, args[0].c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    throw error("cannot start " + args[0] + ": " + std::strerror(rc));
  }
  c.out = out[0];
  c.err = err[0];
  std::string prefix =
    c.rank == 0 ? std::string() : "[node " + std::to_string(c.rank) + "] ";
  c.out_reader = std::thread(relay, c.out, stdout, prefix, on_line);
  c.err_reader = std::thread(relay, c.err, stderr, prefix, nullptr);
}

/// A private temporary directory (removed by the caller).
std::string make_temp_dir() {
  char tmpl[] = "/tmp/h2-launch-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr)
    throw error(std::string("cannot create a temporary directory: ") +
                std::strerror(errno));
  return tmpl;
}

/// A random secret in a file of `dir` only this user can read.
std::string make_secret_file(const std::string& dir) {
  std::string path = dir + "/secret";
  unsigned char bytes[32];
  random_bytes(bytes, sizeof(bytes)); // throws random_error when the RNG fails
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw error("cannot write " + path);
  for (unsigned char b : bytes) {
    char hexpair[3];
    std::snprintf(hexpair, sizeof(hexpair), "%02x", b);
    if (::write(fd, hexpair, 2) != 2)
      throw error("cannot write " + path);
  }
  ::close(fd);
  return path;
}

} // namespace

int launch_nodes(const launch_options& o) {
  auto job = load_job(o.job_path, o.flags);
  if (static_cast<int>(job->nodes.size()) != o.nodes)
    throw config_error(
      "--nodes", std::to_string(o.nodes) + " processes but the job declares " +
                   std::to_string(job->nodes.size()) + " [[nodes]]");
  std::string tmpdir = make_temp_dir();
  std::string secret = job->security.secret_file;
  if (secret.empty())
    secret = make_secret_file(tmpdir);
  std::string job_path = o.job_path;
  if (job_path.empty()) {
    // The built-in demo, written out so every node reads the same text.
    job_path = tmpdir + "/demo.toml";
    std::ofstream(job_path) << job_text("");
  }
  const auto& f = o.flags;
  int metrics_base = f.metrics_port >= 0 ? f.metrics_port : job->metrics.port;
  bool metrics = !f.no_metrics && (f.metrics_port >= 0 || metrics_base > 0);

  std::vector<child> children(static_cast<std::size_t>(o.nodes));
  std::mutex state_mutex;
  std::condition_variable coordinator_known;
  std::optional<std::string> coordinator;
  std::map<int, std::string> targets;
  std::regex coordinator_line(R"(coordinator at (\S+:\d+))");
  std::regex metrics_line(R"(metrics at http://([^/\s]+)/metrics)");

  auto args_for = [&](int rank) {
    std::vector<std::string> a = {o.node_binary,
                                  "--job",
                                  job_path,
                                  "--node-rank",
                                  std::to_string(rank),
                                  "--world-size",
                                  std::to_string(o.nodes),
                                  "--secret-file",
                                  secret,
                                  "--coordinator",
                                  rank == 0 ? "127.0.0.1:0" : *coordinator};
    if (f.steps > 0)
      a.insert(a.end(), {"--steps", std::to_string(f.steps)});
    if (metrics)
      a.insert(a.end(),
               {"--metrics-port",
                std::to_string(metrics_base > 0 ? metrics_base + rank : 0)});
    else
      a.push_back("--no-metrics");
    if (rank == 0) {
      if (!f.json_log.empty())
        a.insert(a.end(), {"--json-log", f.json_log});
      if (!f.trace.empty())
        a.insert(a.end(), {"--trace", f.trace});
      if (!f.plan_path.empty())
        a.insert(a.end(), {"--plan", f.plan_path});
      if (!f.export_path.empty())
        a.insert(a.end(), {"--export", f.export_path});
    }
    if (f.quiet)
      a.push_back("--quiet");
    return a;
  };
  auto watch = [&](int rank) {
    return [&, rank](const std::string& line) {
      std::smatch m;
      std::lock_guard<std::mutex> guard(state_mutex);
      if (rank == 0 && !coordinator &&
          std::regex_search(line, m, coordinator_line)) {
        coordinator = m[1];
        coordinator_known.notify_all();
      }
      if (std::regex_search(line, m, metrics_line))
        targets[rank] = m[1];
    };
  };

  // Signals go to every node: a first one stops the job at the next step
  // boundary, a second one aborts it.
  signal_watcher signals(nullptr);
  std::atomic<int> forwarded{0};
  auto forward = [&] {
    int want = signals.stop_flag()->load();
    while (forwarded.load() < want) {
      ++forwarded;
      for (auto& c : children)
        if (c.pid > 0)
          ::kill(c.pid, signals.signal());
    }
  };

  children[0].rank = 0;
  spawn(children[0], args_for(0), watch(0));
  {
    std::unique_lock<std::mutex> lock(state_mutex);
    while (!coordinator) {
      lock.unlock();
      int status = 0;
      if (::waitpid(children[0].pid, &status, WNOHANG) == children[0].pid) {
        children[0].pid = -1;
        children[0].out_reader.join();
        children[0].err_reader.join();
        std::filesystem::remove_all(tmpdir);
        return WIFEXITED(status) ? WEXITSTATUS(status) : exit_failed;
      }
      forward();
      lock.lock();
      coordinator_known.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
  for (int r = 1; r < o.nodes; ++r) {
    children[static_cast<std::size_t>(r)].rank = r;
    spawn(children[static_cast<std::size_t>(r)], args_for(r), watch(r));
  }

  auto code_of = [](int status) {
    if (WIFEXITED(status))
      return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
      return exit_signal_base + WTERMSIG(status);
    return exit_failed;
  };
  bool targets_written = false;
  int running = o.nodes;
  // Once a node fails, the others end on their own within the failure
  // bound (docs/transport.md); a node that does not (stopped, wedged) is
  // killed after this grace.
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  while (running > 0) {
    forward();
    for (auto& c : children) {
      if (c.pid <= 0)
        continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.status = status;
        c.pid = -1;
        --running;
        if (code_of(status) != exit_ok && !kill_at)
          kill_at = std::chrono::steady_clock::now() + failure_grace;
      }
    }
    if (kill_at && std::chrono::steady_clock::now() >= *kill_at)
      for (auto& c : children)
        if (c.pid > 0 && !c.killed) {
          std::lock_guard<std::mutex> out(output_mutex);
          std::fprintf(stderr,
                       "h2-launch: node %d did not end within %lld s of the "
                       "failure; killing it\n",
                       c.rank, static_cast<long long>(failure_grace.count()));
          ::kill(c.pid, SIGKILL);
          c.killed = true;
        }
    if (!targets_written && metrics && !o.targets_file.empty()) {
      std::lock_guard<std::mutex> guard(state_mutex);
      if (static_cast<int>(targets.size()) == o.nodes) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& [rank, target] : targets)
          j.push_back(
            {{"targets", {target}},
             {"labels", {{"job", job->name}, {"node", std::to_string(rank)}}}});
        std::ofstream(o.targets_file) << j.dump(2) << '\n';
        std::lock_guard<std::mutex> out(output_mutex);
        std::printf("h2-launch: Prometheus file_sd targets in %s\n",
                    o.targets_file.c_str());
        std::fflush(stdout);
        targets_written = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& c : children) {
    c.out_reader.join();
    c.err_reader.join();
  }
  std::filesystem::remove_all(tmpdir);

  // Reports every node that did not end cleanly; the code is the lowest
  // rank's that failed on its own (rank 0 names the root cause), not that
  // of a node we killed.
  int code = exit_ok;
  for (const auto& c : children) {
    int cc = code_of(c.status);
    if (cc == exit_ok)
      continue;
    if (WIFSIGNALED(c.status))
      std::fprintf(stderr, "h2-launch: node %d was killed by signal %d%s\n",
                   c.rank, WTERMSIG(c.status),
                   c.killed ? " (by h2-launch)" : "");
    else
      std::fprintf(stderr, "h2-launch: node %d ended with code %d\n", c.rank,
                   cc);
    if (code == exit_ok && !c.killed)
      code = cc;
  }
  if (code == exit_ok)
    code = code_of(children[0].status);
  return code;
}

} // namespace h2::apps
