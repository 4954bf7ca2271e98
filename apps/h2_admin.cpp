// h2-admin: steers a running job through its admin endpoint (docs/admin.md).
// One sealed request per call; prints the job's answer. Exit codes: 0 done,
// 1 refused by the job (the reason on stderr), 2 bad usage or token file,
// 3 the endpoint cannot be reached or did not answer.
#include "h2/apps/app.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/apps/session.hpp"
#include "h2/core/error.hpp"
#include "h2/runtime/admin.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

using namespace h2;
using clock = std::chrono::steady_clock;
using nlohmann::json;

/// The endpoint could not be reached, or did not answer in time.
class unreachable : public error {
public:
  using error::error;
};

int millis_left(clock::time_point until) {
  auto left =
    std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

/// Sends `line` to HOST:PORT and returns the answer line.
std::string exchange(const std::string& address, const std::string& line,
                     std::chrono::seconds timeout) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    throw config_error("--address",
                       "expected HOST:PORT, got \"" + address + "\"");
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  const auto until = clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found))
    throw unreachable("cannot resolve " + address + ": " + ::gai_strerror(rc));
  int fd = -1;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  a->ai_protocol);
    if (fd < 0)
      continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof(err);
    if (::poll(&p, 1, millis_left(until)) != 1 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      why = err != 0 ? std::strerror(err) : "timed out";
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0)
    throw unreachable("cannot connect to " + address + ": " + why);
  const std::string out = line + "\n";
  std::size_t sent = 0;
  std::string answer;
  char buf[4096];
  try {
    while (sent < out.size()) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, millis_left(until)) != 1)
        throw unreachable("timed out sending to " + address);
      ssize_t n =
        ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR))
        continue;
      if (n <= 0)
        throw unreachable("the endpoint at " + address +
                          " closed the connection");
      sent += static_cast<std::size_t>(n);
    }
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, millis_left(until)) != 1)
        throw unreachable("no answer from " + address + " within " +
                          std::to_string(timeout.count()) + " s");
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR))
        continue;
      if (n <= 0)
        break;
      answer.append(buf, static_cast<std::size_t>(n));
      if (answer.find('\n') != std::string::npos)
        break;
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  const auto end = answer.find('\n');
  if (end == std::string::npos)
    throw unreachable("the endpoint at " + address +
                      " closed the connection without an answer");
  return answer.substr(0, end);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error("--plan", "cannot read \"" + path + "\"");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// h2-admin status without --json.
void print_status(const json& s) {
  std::printf("job %s: step %d of %d, plan %d (%s), %s (last step %.4f s)\n",
              s.value("job", "?").c_str(), s.value("step", 0),
              s.value("steps", 0), s.value("plan_generation", 0),
              s.value("schedule", "?").c_str(), s.value("phase", "?").c_str(),
              s.value("last_step_seconds", 0.0));
  if (s.contains("policy")) {
    const auto& p = s["policy"];
    std::printf("policy %s: threshold %.1f%%, window %d, min interval %d; "
                "predicted step %.4f s, best within the live limits %.4f s\n",
                p.value("mode", "?").c_str(), 100.0 * p.value("threshold", 0.0),
                p.value("window", 0), p.value("min_interval", 0),
                p.value("predicted_step_seconds", 0.0),
                p.value("best_predicted_step_seconds", 0.0));
  }
  std::printf("%-6s %-24s %7s %5s %5s %-9s %8s %7s %9s %10s\n", "chip",
              "device", "replica", "stage", "chunk", "layers", "throttle",
              "speed", "idle s", "peak MiB");
  for (const auto& c : s["chips"]) {
    const auto layers = c["layers"];
    char range[32];
    std::snprintf(range, sizeof(range), "[%d, %d)", layers[0].get<int>(),
                  layers[1].get<int>());
    std::printf("%-6s %-24s %7d %5d %5d %-9s %8.2f",
                c.value("chip", "?").c_str(), c.value("device", "?").c_str(),
                c.value("replica", 0), c.value("stage", 0), c.value("chunk", 0),
                range, c.value("throttle", 1.0));
    if (c.contains("compute_factor"))
      std::printf(" %6.2fx %9.4f %10.1f", c["compute_factor"].get<double>(),
                  c["idle_seconds"].get<double>(),
                  c["peak_bytes"].get<double>() / (1 << 20));
    std::printf("\n");
  }
}

} // namespace

int main(int argc, char** argv) {
  std::string address, token_file;
  bool as_json = false;
  int timeout = 30;
  CLI::App cli{"Steer a running H2 job through its admin endpoint "
               "(docs/admin.md). Commands: status [--json], plan, rebalance "
               "--auto, rebalance --plan FILE [--restart], policy auto|off, "
               "pause, resume, checkpoint, throttle CHIP FACTOR, stop."};
  cli.add_option("--address", address, "The job's admin endpoint, HOST:PORT")
    ->required();
  cli
    .add_option("--token-file", token_file,
                "The admin token ([admin] "
                "token_file of the job)")
    ->required();
  cli.add_flag("--json", as_json, "Print the job's answer as JSON");
  cli.add_option("--timeout", timeout, "Seconds to wait for the answer")
    ->check(CLI::Range(1, 3600));
  cli.prefix_command();
  return apps::parse_and_run(cli, argc, argv, "h2-admin", [&]() -> int {
    auto words = cli.remaining();
    if (words.empty())
      throw config_error("", "no command (status, plan, rebalance, policy, "
                             "pause, resume, checkpoint, throttle, stop)");
    std::string command = words.front();
    std::vector<std::string> args(words.begin() + 1, words.end());
    if (command == "status" && !args.empty() && args.back() == "--json") {
      as_json = true;
      args.pop_back();
    }
    if (command == "rebalance" && args.size() >= 2 && args[0] == "--plan")
      args[1] = read_file(args[1]); // the job gets the plan, not its path
    try {
      runtime::parse_admin_command(command, args); // bad usage: exit 2
    } catch (const runtime::admin_error& e) {
      throw config_error("", e.what());
    }
    const auto token = runtime::load_admin_token(token_file, "--token-file");
    const auto seq = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::system_clock::now().time_since_epoch())
        .count());
    const auto request =
      runtime::seal_admin_request(*token, seq, command, std::move(args));
    std::string line;
    try {
      line = exchange(address, runtime::encode_admin_request(request),
                      std::chrono::seconds(timeout));
    } catch (const unreachable& e) {
      std::cerr << "h2-admin: error: " << e.what() << std::endl;
      return apps::exit_peer_failed;
    }
    const auto answer = json::parse(line, nullptr, false);
    if (answer.is_discarded() || !answer.is_object() ||
        !answer.contains("ok")) {
      std::cerr << "h2-admin: error: not an admin endpoint's answer: "
                << line.substr(0, 200) << std::endl;
      return apps::exit_peer_failed;
    }
    if (!answer["ok"].get<bool>()) {
      std::cerr << "h2-admin: refused: " << answer.value("error", "?")
                << std::endl;
      return apps::exit_failed;
    }
    const auto& result = answer["result"];
    if (command == "status" && !as_json)
      print_status(result);
    else if (command == "plan" && !as_json)
      std::cout << result.dump(2) << std::endl;
    else
      std::cout << result.dump() << std::endl;
    return apps::exit_ok;
  });
}
