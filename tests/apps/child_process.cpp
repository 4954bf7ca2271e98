#include "child_process.hpp"

#include "h2/core/files.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace h2::test {

namespace {

std::runtime_error system_error(const std::string& what, int err = errno) {
  return std::runtime_error(what + ": " + std::strerror(err));
}

} // namespace

scratch_dir::scratch_dir() {
  std::string pattern =
    (std::filesystem::temp_directory_path() / "h2-apps-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    throw system_error("mkdtemp " + pattern);
  path_ = pattern;
}

scratch_dir::~scratch_dir() {
  if (::testing::Test::HasFailure()) {
    std::cerr << "[ kept     ] the child's files are in " << path_.string()
              << std::endl;
    return;
  }
  h2::remove_tree(path_);
}

std::filesystem::path scratch_dir::write(const std::string& name,
                                         const std::string& text) const {
  auto p = path_ / name;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out)
    throw std::runtime_error("cannot write " + p.string());
  return p;
}

std::filesystem::path
scratch_dir::write_private(const std::string& name,
                           const std::string& text) const {
  auto p = write(name, text);
  std::filesystem::permissions(p, std::filesystem::perms::owner_read |
                                    std::filesystem::perms::owner_write);
  return p;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return {};
  std::ostringstream text;
  text << in.rdbuf();
  return std::move(text).str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string::npos) {
      out.push_back(text.substr(start));
      break;
    }
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::string exit_status::describe() const {
  if (timed_out)
    return "timed out (killed by the test)";
  if (exited)
    return "exit code " + std::to_string(code);
  if (signal != 0)
    return "killed by signal " + std::to_string(signal) + " (" +
           strsignal(signal) + ")";
  return "still running";
}

child_process::child_process(const std::string& program,
                             const std::vector<std::string>& args,
                             std::filesystem::path out,
                             std::filesystem::path err,
                             const std::filesystem::path& stdin_path)
    : out_(std::move(out)), err_(std::move(err)) {
  std::vector<std::string> argv_text;
  argv_text.push_back(program);
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 0, stdin_path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, 1, out_.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&files, 2, err_.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGHUP, SIGQUIT})
    sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // Its own group: the test can kill everything it started, and a Ctrl-C
  // meant for the test runner does not reach it.
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                    POSIX_SPAWN_SETSIGDEF |
                                    POSIX_SPAWN_SETPGROUP);
  int rc =
    posix_spawn(&pid_, program.c_str(), &files, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&files);
  if (rc != 0)
    throw system_error("posix_spawn " + program, rc);
}

child_process::~child_process() {
  if (pid_ > 0 && !reaped_) {
    ::kill(-pid_, SIGKILL);
    int status = 0;
    if (::waitpid(pid_, &status, 0) == pid_)
      reap(status);
  }
}

void child_process::send(int sig) const {
  if (!reaped_)
    ::kill(pid_, sig);
}

void child_process::reap(int status) {
  reaped_ = true;
  if (WIFEXITED(status)) {
    status_.exited = true;
    status_.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    status_.signal = WTERMSIG(status);
  }
}

bool child_process::running() {
  if (reaped_)
    return false;
  int status = 0;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_)
    reap(status);
  return !reaped_;
}

exit_status child_process::wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-pid_, SIGKILL);
      int status = 0;
      if (::waitpid(pid_, &status, 0) == pid_)
        reap(status);
      status_.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status_;
}

bool child_process::wait_until(const std::function<bool()>& condition,
                               std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (condition())
      return true;
    if (!running())
      return condition();
    if (std::chrono::steady_clock::now() >= deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

run_result run_to_end(const std::string& program,
                      const std::vector<std::string>& args,
                      const scratch_dir& dir, std::chrono::milliseconds timeout,
                      const std::filesystem::path& stdin_path) {
  child_process child(program, args, dir / "stdout.txt", dir / "stderr.txt",
                      stdin_path);
  run_result r;
  r.status = child.wait(timeout);
  r.out = child.out();
  r.err = child.err();
  return r;
}

std::string http_get(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw system_error("socket");
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_fd{fd};
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    throw system_error("connect to 127.0.0.1:" + std::to_string(port));
  std::string request = "GET " + path +
                        " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
                        "close\r\n\r\n";
  std::size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n =
      ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0)
      throw system_error("send");
    sent += static_cast<std::size_t>(n);
  }
  std::string response;
  char buf[4096];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0)
      break;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      throw system_error("recv (after " + std::to_string(response.size()) +
                         " bytes)");
    }
    response.append(buf, static_cast<std::size_t>(n));
    if (response.size() > (64u << 20))
      throw std::runtime_error("response larger than 64 MiB");
  }
  return response;
}

std::vector<std::string> shm_entries(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0)
      out.push_back(name);
  }
  return out;
}

scoped_env::scoped_env(std::string name, const std::string& value)
    : name_(std::move(name)) {
  ::setenv(name_.c_str(), value.c_str(), 1);
}

scoped_env::~scoped_env() {
  ::unsetenv(name_.c_str());
}

pid_t node_pid(pid_t parent, int rank) {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr)
    return -1;
  pid_t found = -1;
  while (auto* e = ::readdir(proc)) {
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0)
      continue;
    std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent)
      continue;
    std::string cmd = read_text("/proc/" + std::to_string(pid) + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find("--node-rank " + std::to_string(rank) + " ") !=
        std::string::npos)
      found = pid;
  }
  ::closedir(proc);
  return found;
}

} // namespace h2::test
