// Runs a binary as a real child process for end-to-end tests: stdout and
// stderr to files, its own process group, and a kill-timeout on every wait so
// a hung child fails the test instead of hanging it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace h2::test {

/// A fresh directory under the system's temporary directory. Removed when
/// the test passed; kept (and its path printed) when it failed, so the
/// child's files can be read.
class scratch_dir {
public:
  scratch_dir();
  ~scratch_dir();

  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }

  /// path() / name.
  std::filesystem::path operator/(const std::string& name) const {
    return path_ / name;
  }

  /// Writes `text` to path() / name and returns the path.
  std::filesystem::path write(const std::string& name,
                              const std::string& text) const;

  /// write(), then chmod 600 (secrets and tokens must be private).
  std::filesystem::path write_private(const std::string& name,
                                      const std::string& text) const;

private:
  std::filesystem::path path_;
};

/// The whole file ("" when it does not exist).
std::string read_text(const std::filesystem::path& path);

/// `text` split at '\n'; a final line without '\n' is kept.
std::vector<std::string> lines_of(const std::string& text);

/// How a child ended.
struct exit_status {
  bool exited = false; ///< exited normally (then `code` holds the status)
  int code = -1;
  int signal = 0;         ///< killed by this signal (0: not killed)
  bool timed_out = false; ///< the wait ran out; the test killed it

  /// "exit code 2", "killed by signal 9", "timed out (killed by the test)".
  std::string describe() const;
};

class child_process {
public:
  /// Starts `program` with `args` (argv[1...]) in its own process group,
  /// with default dispositions and an empty signal mask, stdin from
  /// `stdin_path`, stdout and stderr truncated into `out` and `err`.
  /// Throws std::runtime_error when it cannot be spawned.
  child_process(const std::string& program,
                const std::vector<std::string>& args, std::filesystem::path out,
                std::filesystem::path err,
                const std::filesystem::path& stdin_path = "/dev/null");

  /// Kills the process group with SIGKILL and reaps the child if it still
  /// runs.
  ~child_process();

  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const noexcept { return pid_; }

  /// Sends `sig` to the child (not its group).
  void send(int sig) const;

  /// Whether the child still runs (reaps it when it has ended).
  bool running();

  /// Waits for the child to end, at most `timeout`; past it, kills the
  /// process group with SIGKILL, reaps it and reports timed_out.
  exit_status wait(std::chrono::milliseconds timeout);

  /// Polls `condition` every 10 ms. True once it holds; false when the
  /// child ended first (condition checked one last time) or `timeout`
  /// passed.
  bool wait_until(const std::function<bool()>& condition,
                  std::chrono::milliseconds timeout);

  std::string out() const { return read_text(out_); }
  std::string err() const { return read_text(err_); }

private:
  void reap(int status);

  pid_t pid_ = -1;
  bool reaped_ = false;
  exit_status status_;
  std::filesystem::path out_;
  std::filesystem::path err_;
};

/// The result of a child run to its end.
struct run_result {
  exit_status status;
  std::string out;
  std::string err;
};

/// Runs `program args...` to its end in `dir` (stdout.txt, stderr.txt),
/// killing it after `timeout`.
run_result run_to_end(const std::string& program,
                      const std::vector<std::string>& args,
                      const scratch_dir& dir, std::chrono::milliseconds timeout,
                      const std::filesystem::path& stdin_path = "/dev/null");

/// Sends "GET <path>" over a plain TCP socket to 127.0.0.1:port and returns
/// the whole response (status line, headers, body), read until the server
/// closes. Throws std::runtime_error (with errno's text) on failure; every
/// socket call has a 10 s timeout.
std::string http_get(int port, const std::string& path);

/// Sets an environment variable for this scope (children inherit it).
class scoped_env {
public:
  scoped_env(std::string name, const std::string& value);
  ~scoped_env();

  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

private:
  std::string name_;
};

/// The pid of the h2-node child of `parent` running `--node-rank rank`
/// (-1: none yet).
pid_t node_pid(pid_t parent, int rank);

/// Entries of /dev/shm whose name starts with `prefix`.
std::vector<std::string> shm_entries(const std::string& prefix);

} // namespace h2::test
