#include "h2/apps/launcher.hpp"

#include "h2/apps/exit_codes.hpp"
#include "h2/apps/node_report.hpp"
#include "h2/apps/signals.hpp"
#include "h2/core/error.hpp"
#include "h2/core/files.hpp"
#include "h2/core/random.hpp"
#include "h2/runtime/checkpoint_files.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
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
  int out = -1;    ///< read end of its stdout
  int err = -1;    ///< read end of its stderr
  int report = -1; ///< read end of its events (node_report)
  std::thread out_reader, err_reader, report_reader;
  /// The last state it reported (node_report::state), under the launch's
  /// state mutex while it runs.
  std::string state;
  int status = 0;
  bool killed = false; ///< by us, after a failure elsewhere
};

/// How long the other nodes have to end once one failed.
constexpr std::chrono::seconds failure_grace{8};

/// Writes whole lines to our stdout/stderr, never interleaved mid-line.
std::mutex output_mutex;

void relay(int fd, FILE* to, const std::string& prefix) {
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

/// Reads a node's events (JSON lines, node_report) until it closes them.
void read_events(int fd, const std::function<void(const node_event&)>& on) {
  std::string pending;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) {
    pending.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      if (auto e = parse_node_event(std::string_view(pending).substr(0, nl)))
        on(*e);
      pending.erase(0, nl + 1);
    }
    if (pending.size() > 4096) // no event is that long
      pending.clear();
  }
  ::close(fd);
}

/// The fd a node writes its events to (--report-fd).
constexpr int report_fd = 3;

/// Starts a node with `args`; relays its output and hands its events to
/// `on_event` on threads of their own.
void spawn(child& c, const std::vector<std::string>& args,
           const std::function<void(const node_event&)>& on_event) {
  int pipes[3][2];
  for (int i = 0; i < 3; ++i)
    if (::pipe2(pipes[i], O_CLOEXEC) != 0) {
      const int e = errno;
      for (int j = 0; j < i; ++j) {
        ::close(pipes[j][0]);
        ::close(pipes[j][1]);
      }
      throw error(std::string("cannot create pipes: ") + std::strerror(e));
    }
  int* out = pipes[0];
  int* err = pipes[1];
  int* rep = pipes[2];
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  posix_spawn_file_actions_adddup2(&actions, rep[1], report_fd);
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
  ::close(rep[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    ::close(rep[0]);
    throw error("cannot start " + args[0] + ": " + std::strerror(rc));
  }
  c.out = out[0];
  c.err = err[0];
  c.report = rep[0];
  std::string prefix =
    c.rank == 0 ? std::string() : "[node " + std::to_string(c.rank) + "] ";
  c.out_reader = std::thread(relay, c.out, stdout, prefix);
  c.err_reader = std::thread(relay, c.err, stderr, prefix);
  c.report_reader = std::thread(read_events, c.report, on_event);
}

/// A private temporary directory (mode 700), removed with everything in
/// it when this goes: on every way out of a launch, exceptions included.
class temp_dir {
public:
  temp_dir() {
    char tmpl[] = "/tmp/h2-launch-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr)
      throw error(std::string("cannot create a temporary directory: ") +
                  std::strerror(errno));
    path_ = tmpl;
  }
  ~temp_dir() { h2::remove_tree(path_); }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::string& path() const noexcept { return path_; }

private:
  std::string path_;
};

/// A random secret in a file of `dir` only this user can read.
std::string make_secret_file(const std::string& dir) {
  std::string path = dir + "/secret";
  unsigned char bytes[32];
  random_bytes(bytes, sizeof(bytes)); // throws random_error when the RNG fails
  std::string text;
  for (unsigned char b : bytes) {
    char hexpair[3];
    std::snprintf(hexpair, sizeof(hexpair), "%02x", b);
    text += hexpair;
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw error("cannot write " + path + ": " + std::strerror(errno));
  const bool written =
    ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int e = errno;
  ::close(fd);
  if (!written)
    throw error("cannot write " + path + ": " + std::strerror(e));
  return path;
}

} // namespace

namespace {

/// What launching every node once came to.
struct attempt {
  int code = exit_ok; ///< the job's exit code
  /// Nodes whose process died (a signal we did not forward: SIGKILL, a
  /// crash) or had to be killed because it did not end after a failure.
  std::vector<int> failed;
  std::string cause; ///< "node 1 was killed by signal 9", ...
};

/// What stays the same across the attempts of one launch.
struct launch_state {
  const launch_options& o;
  std::shared_ptr<job_config> job; ///< as written, every node
  std::string job_path;            ///< the job file every node reads
  std::string secret;              ///< the secret file
  std::string temp_dir; ///< removed by the nodes if this process dies
  signal_watcher& signals;
};

int code_of(int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  if (WIFSIGNALED(status))
    return exit_signal_base + WTERMSIG(status);
  return exit_failed;
}

std::string joined(const std::vector<int>& xs) {
  std::string out;
  for (int x : xs)
    out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

/// How one node of an attempt is started.
struct node_start {
  const std::vector<int>& excluded;
  int restarts = 0;
  int rank = 0;
  int lead = 0;            ///< the rank that hosts the coordinator
  std::string coordinator; ///< HOST:PORT (the lead's: port 0)
  bool metrics = false;
  int metrics_base = 0; ///< > 0: each node's port is base + rank
};

/// The argv of h2-node for one node: where it is in the job, its metrics
/// port, and the run flags (run_flag_table: those of every node, and the
/// coordinator's own for the lowest rank).
std::vector<std::string> node_argv(const launch_state& ls, const run_flags& f,
                                   const job_config& job, const node_start& n) {
  std::vector<std::string> a = {ls.o.node_binary,
                                "--job",
                                ls.job_path,
                                "--node-rank",
                                std::to_string(n.rank),
                                "--world-size",
                                std::to_string(job.nodes.size()),
                                "--secret-file",
                                ls.secret,
                                "--coordinator",
                                n.coordinator,
                                "--launcher-pid",
                                std::to_string(::getpid()),
                                "--launcher-dir",
                                ls.temp_dir};
  if (!n.excluded.empty())
    a.insert(a.end(), {"--exclude-nodes", joined(n.excluded)});
  if (n.restarts > 0)
    a.insert(a.end(), {"--restarts", std::to_string(n.restarts)});
  if (n.metrics)
    a.insert(a.end(), {"--metrics-port",
                       std::to_string(
                         n.metrics_base > 0 ? n.metrics_base + n.rank : 0)});
  else
    a.push_back("--no-metrics");
  a.insert(a.end(), {"--report-fd", std::to_string(report_fd)});
  const auto run = run_flags_argv(f, n.rank == n.lead);
  a.insert(a.end(), run.begin(), run.end());
  return a;
}

/// Prometheus file_sd targets: every node's metrics endpoint.
void write_targets(const std::string& path, const std::string& job_name,
                   const std::map<int, std::string>& targets) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [rank, target] : targets)
    j.push_back(
      {{"targets", {target}},
       {"labels", {{"job", job_name}, {"node", std::to_string(rank)}}}});
  std::ofstream(path) << j.dump(2) << '\n';
  std::lock_guard<std::mutex> out(output_mutex);
  std::printf("h2-launch: Prometheus file_sd targets in %s\n", path.c_str());
  std::fflush(stdout);
}

/// Reports every node that did not end cleanly; the code is the lowest
/// rank's that failed on its own (the coordinator names the root cause),
/// not that of a node we killed. While stopping, a node killed by a signal
/// is no failure to restart without.
void report_ends(const std::vector<child>& children, bool stopping,
                 attempt& result) {
  for (const auto& c : children) {
    int cc = code_of(c.status);
    if (cc == exit_ok)
      continue;
    std::string what;
    if (WIFSIGNALED(c.status))
      what = "node " + std::to_string(c.rank) + " was killed by signal " +
             std::to_string(WTERMSIG(c.status)) +
             (c.killed ? " (by h2-launch)" : "") +
             (c.state != "running" ? " before it joined" : "");
    else
      what = "node " + std::to_string(c.rank) + " ended with code " +
             std::to_string(cc);
    std::fprintf(stderr, "h2-launch: %s\n", what.c_str());
    if (WIFSIGNALED(c.status) && !stopping) {
      result.failed.push_back(c.rank);
      result.cause += (result.cause.empty() ? "" : "; ") + what;
    }
    if (result.code == exit_ok && !c.killed)
      result.code = cc;
  }
  if (result.code == exit_ok)
    result.code = code_of(children[0].status);
}

/// Reaps the nodes that ended (returns how many); once one failed, kills
/// those still running failure_grace later. Once a node fails, the others
/// end on their own within the failure bound (docs/transport.md); a node
/// that does not (stopped, wedged) is killed.
std::size_t
reap_nodes(std::vector<child>& children,
           std::optional<std::chrono::steady_clock::time_point>& kill_at) {
  std::size_t ended = 0;
  for (auto& c : children) {
    if (c.pid <= 0)
      continue;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.status = status;
      c.pid = -1;
      ++ended;
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
  return ended;
}

/// Starts a node for every node of the job that is not `excluded` (the
/// lowest rank first: it hosts the coordinator), relays their output,
/// forwards signals and waits for all of them.
attempt run_nodes(const launch_state& ls, const run_flags& f,
                  const std::vector<int>& excluded, int restarts) {
  const auto& o = ls.o;
  job_config job = *ls.job;
  exclude_nodes(job, excluded);
  const int lead = job.nodes.front().rank;
  int metrics_base = f.metrics_port >= 0 ? f.metrics_port : job.metrics.port;
  bool metrics = !f.no_metrics && (f.metrics_port >= 0 || metrics_base > 0);

  std::vector<child> children(job.nodes.size());
  for (std::size_t i = 0; i < children.size(); ++i)
    children[i].rank = job.nodes[i].rank;
  std::mutex state_mutex;
  std::condition_variable coordinator_known;
  std::optional<std::string> coordinator;
  std::map<int, std::string> targets;

  auto args_for = [&](int rank) {
    return node_argv(ls, f, job,
                     {excluded, restarts, rank, lead,
                      rank == lead ? "127.0.0.1:0" : *coordinator, metrics,
                      metrics_base});
  };
  auto watch = [&](std::size_t i) {
    return [&, i](const node_event& e) {
      std::lock_guard<std::mutex> guard(state_mutex);
      const int rank = children[i].rank;
      if (e.event == "state")
        children[i].state = e.state;
      else if (e.service == "coordinator" && rank == lead && !coordinator) {
        coordinator = e.address;
        coordinator_known.notify_all();
      } else if (e.service == "metrics")
        targets[rank] = e.address;
    };
  };

  // Signals go to every node: a first one stops the job at the next step
  // boundary, a second one aborts it.
  int forwarded = 0;
  auto forward = [&] {
    int want = ls.signals.stop_flag()->load();
    while (forwarded < want) {
      ++forwarded;
      for (auto& c : children)
        if (c.pid > 0)
          ::kill(c.pid, ls.signals.signal());
    }
  };

  attempt result;
  spawn(children[0], args_for(lead), watch(0));
  {
    std::unique_lock<std::mutex> lock(state_mutex);
    while (!coordinator) {
      lock.unlock();
      int status = 0;
      if (::waitpid(children[0].pid, &status, WNOHANG) == children[0].pid) {
        children[0].pid = -1;
        children[0].out_reader.join();
        children[0].err_reader.join();
        children[0].report_reader.join();
        result.code = WIFEXITED(status) ? WEXITSTATUS(status) : exit_failed;
        return result;
      }
      forward();
      lock.lock();
      coordinator_known.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
  for (std::size_t i = 1; i < children.size(); ++i)
    spawn(children[i], args_for(children[i].rank), watch(i));

  bool targets_written = false;
  auto running = children.size();
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  while (running > 0) {
    forward();
    running -= reap_nodes(children, kill_at);
    if (!targets_written && metrics && !o.targets_file.empty()) {
      std::lock_guard<std::mutex> guard(state_mutex);
      if (targets.size() == children.size()) {
        write_targets(o.targets_file, job.name, targets);
        targets_written = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& c : children) {
    c.out_reader.join();
    c.err_reader.join();
    c.report_reader.join();
  }

  report_ends(children, ls.signals.stop_flag()->load() > 0, result);
  return result;
}

} // namespace

int launch_nodes(const launch_options& o) {
  auto job = load_job(o.job_path, o.flags);
  if (static_cast<int>(job->nodes.size()) != o.nodes)
    throw config_error(
      "--nodes", std::to_string(o.nodes) + " processes but the job declares " +
                   std::to_string(job->nodes.size()) + " [[nodes]]");
  const temp_dir tmp;
  std::string secret = job->security.secret_file;
  if (secret.empty())
    secret = make_secret_file(tmp.path());
  std::string job_path = o.job_path;
  if (job_path.empty()) {
    // The built-in demo, written out so every node reads the same text.
    job_path = tmp.path() + "/demo.toml";
    std::ofstream(job_path) << job_text("");
  }
  signal_watcher signals(nullptr);
  const launch_state ls{o, job, job_path, secret, tmp.path(), signals};

  // A node that dies ends the job everywhere; with [restart] the job goes
  // on without it, from its last checkpoint, up to restart.max times.
  run_flags flags = o.flags;
  std::vector<int> excluded;
  attempt a;
  for (int restarts = 0;; ++restarts) {
    a = run_nodes(ls, flags, excluded, restarts);
    if (a.code == exit_ok || a.failed.empty() ||
        restarts >= job->restart.max || signals.stop_flag()->load() > 0)
      break;
    excluded.insert(excluded.end(), a.failed.begin(), a.failed.end());
    std::sort(excluded.begin(), excluded.end());
    if (excluded.size() >= job->nodes.size())
      break;
    // The plans were for the chips that were; HeteroAuto plans the rest.
    flags.plan_path.clear();
    flags.replans.clear();
    auto latest = runtime::latest_checkpoint(job->checkpoint.dir, nullptr);
    flags.resume = latest ? latest->string() : "";
    if (latest) // --init-from saved step 0 there at the least
      flags.init_from.clear();
    std::string left;
    for (const auto& n : job->nodes)
      if (std::find(excluded.begin(), excluded.end(), n.rank) ==
          excluded.end())
        left += (left.empty() ? "" : ", ") + std::to_string(n.rank);
    std::lock_guard<std::mutex> out(output_mutex);
    std::fprintf(stderr,
                 "h2-launch: restart %d of %d after %s: re-planning on "
                 "node%s %s, %s\n",
                 restarts + 1, job->restart.max, a.cause.c_str(),
                 left.find(',') == std::string::npos ? "" : "s", left.c_str(),
                 latest ? ("resuming from " + latest->string()).c_str()
                        : "from step 0 (no checkpoint yet)");
  }
  return a.code;
}

} // namespace h2::apps
