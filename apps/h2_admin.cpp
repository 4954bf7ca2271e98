// h2-admin: steers a running job through its admin endpoint (docs/admin.md).
// One sealed request per call; prints the job's answer. Exit codes: 0 done,
// 1 refused by the job (the reason on stderr), 2 bad usage or token file,
// 3 the endpoint cannot be reached or did not answer.
#include "h2/apps/app.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/apps/session.hpp"
#include "h2/apps/tls_client.hpp"
#include "h2/core/error.hpp"
#include "h2/runtime/admin.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
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

/// The endpoint answered what an H2 job does not send.
class bad_answer : public error {
public:
  using error::error;
};

/// Bytes an answer may take (the status of 10,240 chips is about 3 MiB).
constexpr std::size_t max_answer_bytes = std::size_t{64} << 20;

int millis_left(clock::time_point until) {
  auto left =
    std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

/// What one call of h2-admin may take: its --timeout, for all its
/// exchanges together.
struct deadline {
  clock::time_point until;
  std::chrono::seconds timeout; ///< for messages
};

/// The body of an HTTP response (a status line, headers, a blank line,
/// then the body; Content-Length, when given, must match).
std::string body_of(const std::string& response, const std::string& address) {
  if (response.empty())
    throw unreachable("the endpoint at " + address +
                      " closed the connection without an answer");
  if (response.rfind("HTTP/1.", 0) != 0)
    throw bad_answer("not an HTTP response: " + response.substr(0, 80));
  const auto end = response.find("\r\n\r\n");
  if (end == std::string::npos)
    throw bad_answer("an HTTP response without the end of its head");
  // The endpoint answers these with a JSON body; anything else (a 413 for a
  // body it would not take, a 500) is said as it came.
  const std::string status = response.substr(9, 3);
  if (status != "200" && status != "400" && status != "401" && status != "409")
    throw bad_answer(
      "HTTP " +
      response.substr(9, std::min<std::size_t>(response.find('\r') - 9, 60)));
  std::string body = response.substr(end + 4);
  std::string head = response.substr(0, end + 2);
  for (auto& c : head)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto at = head.find("\r\ncontent-length:");
  if (at != std::string::npos) {
    const auto length = std::strtoull(head.c_str() + at + 17, nullptr, 10);
    if (length != body.size())
      throw unreachable("the endpoint at " + address + " sent " +
                        std::to_string(body.size()) + " of " +
                        std::to_string(length) + " bytes of its answer");
  }
  return body;
}

/// Where the job's endpoint is, and how to reach it.
struct endpoint {
  std::string address;          ///< HOST:PORT
  apps::tls_client_options tls; ///< ca "": plain HTTP
  /// tls's files, loaded before anything is sent (null: plain HTTP).
  std::shared_ptr<const apps::tls_client_context> context;
};

/// A non-blocking socket connected to `address` (HOST:PORT) by `until`;
/// `host` is set to its HOST.
int connect_to(const std::string& address, std::string& host,
               clock::time_point until) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size())
    throw config_error("--address",
                       "expected HOST:PORT, got \"" + address + "\"");
  host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
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
  return fd;
}

/// Sends all of `out` over the plain socket `fd`, by `until`.
void send_plain(int fd, const std::string& out, const std::string& address,
                clock::time_point until) {
  std::size_t sent = 0;
  while (sent < out.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, millis_left(until)) != 1)
      throw unreachable("timed out sending to " + address);
    ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    if (n <= 0)
      throw unreachable("the endpoint at " + address +
                        " closed the connection");
    sent += static_cast<std::size_t>(n);
  }
}

/// Reads what has come over the plain socket `fd`, up to `n` bytes, by
/// `by.until`; 0 once the endpoint closed it.
std::size_t recv_plain(int fd, char* buf, std::size_t n,
                       const std::string& address, const deadline& by) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, millis_left(by.until)) != 1)
      throw unreachable("no answer from " + address + " within " +
                        std::to_string(by.timeout.count()) + " s");
    const ssize_t got = ::recv(fd, buf, n, 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR))
      continue;
    return got > 0 ? static_cast<std::size_t>(got) : 0;
  }
}

/// POSTs `body` to HOST:PORT/admin and returns the answer's body, by
/// `by.until`.
std::string exchange(const endpoint& at, const std::string& body,
                     const deadline& by) {
  const auto& address = at.address;
  const auto until = by.until;
  std::string host;
  const int fd = connect_to(address, host, until);
  const std::string out = "POST /admin HTTP/1.1\r\nHost: " + address +
                          "\r\nContent-Type: application/json\r\n"
                          "Content-Length: " +
                          std::to_string(body.size()) +
                          "\r\nConnection: close\r\n\r\n" + body;
  std::string answer;
  char buf[4096];
  try {
    std::unique_ptr<apps::tls_client> tls;
    if (at.context) {
      tls = std::make_unique<apps::tls_client>(fd, host, *at.context, until);
      tls->write_all(out, until);
    } else {
      send_plain(fd, out, address, until);
    }
    // The server closes the connection after its answer.
    while (const std::size_t n =
             tls ? tls->read_some(buf, sizeof(buf), until)
                 : recv_plain(fd, buf, sizeof(buf), address, by)) {
      answer.append(buf, n);
      if (answer.size() > max_answer_bytes)
        throw unreachable("the endpoint at " + address +
                          " sent an answer larger than " +
                          std::to_string(max_answer_bytes >> 20) + " MiB");
    }
  } catch (const unreachable&) {
    ::close(fd);
    throw;
  } catch (const error& e) { // TLS: the endpoint's failure too
    ::close(fd);
    throw unreachable(e.what());
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return body_of(answer, address);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error("--plan", "cannot read \"" + path + "\"");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// `j[key]` when it is there and of `kind` ('s' string, 'i' integer,
/// 'n' number, 'o' object, 'a' array, 'b' boolean); throws bad_answer
/// naming it otherwise.
const json& need(const json& j, const std::string& where, const char* key,
                 char kind) {
  auto it = j.is_object() ? j.find(key) : j.end();
  const bool fits = it != j.end() && (kind == 's'   ? it->is_string()
                                      : kind == 'i' ? it->is_number_integer()
                                      : kind == 'n' ? it->is_number()
                                      : kind == 'o' ? it->is_object()
                                      : kind == 'a' ? it->is_array()
                                                    : it->is_boolean());
  if (!fits) {
    static const std::map<char, const char*> names = {
      {'s', "a string"},  {'i', "an integer"}, {'n', "a number"},
      {'o', "an object"}, {'a', "an array"},   {'b', "true or false"}};
    throw bad_answer(where + "\"" + key + "\" is not " + names.at(kind));
  }
  return *it;
}

/// Checks every field print_status prints.
void check_status(const json& s) {
  for (const char* k : {"job", "schedule", "phase"})
    need(s, "status: ", k, 's');
  for (const char* k : {"step", "steps", "plan_generation"})
    need(s, "status: ", k, 'i');
  need(s, "status: ", "last_step_seconds", 'n');
  if (s.contains("policy")) {
    const auto& p = need(s, "status: ", "policy", 'o');
    need(p, "status policy: ", "mode", 's');
    for (const char* k : {"window", "min_interval"})
      need(p, "status policy: ", k, 'i');
    for (const char* k :
         {"threshold", "predicted_step_seconds", "best_predicted_step_seconds"})
      need(p, "status policy: ", k, 'n');
  }
  for (const auto& c : need(s, "status: ", "chips", 'a')) {
    for (const char* k : {"chip", "device"})
      need(c, "status chip: ", k, 's');
    for (const char* k : {"replica", "stage", "chunk"})
      need(c, "status chip: ", k, 'i');
    need(c, "status chip: ", "throttle", 'n');
    const auto& layers = need(c, "status chip: ", "layers", 'a');
    if (layers.size() != 2 || !layers[0].is_number_integer() ||
        !layers[1].is_number_integer())
      throw bad_answer("status chip: \"layers\" is not two integers");
    if (c.contains("compute_factor"))
      for (const char* k : {"compute_factor", "idle_seconds", "peak_bytes"})
        need(c, "status chip: ", k, 'n');
  }
}

/// The result of a successful `command`, checked: status and plan as the
/// job sends them, any other command's an object.
const json& checked_result(const json& answer, const std::string& command) {
  const auto& result = need(answer, "", "result", 'o');
  if (command == "status")
    check_status(result);
  if (command == "plan") {
    need(result, "plan: ", "generation", 'i');
    need(result, "plan: ", "step", 'i');
    need(result, "plan: ", "plan", 'o');
  }
  return result;
}

/// h2-admin status without --json (check_status checked every field).
void print_status(const json& s) {
  std::printf("job %s: step %d of %d, plan %d (%s), %s (last step %.4f s)\n",
              s["job"].get<std::string>().c_str(), s["step"].get<int>(),
              s["steps"].get<int>(), s["plan_generation"].get<int>(),
              s["schedule"].get<std::string>().c_str(),
              s["phase"].get<std::string>().c_str(),
              s["last_step_seconds"].get<double>());
  if (s.contains("policy")) {
    const auto& p = s["policy"];
    std::printf("policy %s: threshold %.1f%%, window %d, min interval %d; "
                "predicted step %.4f s, best within the live limits %.4f s\n",
                p["mode"].get<std::string>().c_str(),
                100.0 * p["threshold"].get<double>(), p["window"].get<int>(),
                p["min_interval"].get<int>(),
                p["predicted_step_seconds"].get<double>(),
                p["best_predicted_step_seconds"].get<double>());
  }
  std::printf("%-6s %-24s %7s %5s %5s %-9s %8s %7s %9s %10s\n", "chip",
              "device", "replica", "stage", "chunk", "layers", "throttle",
              "speed", "idle s", "peak MiB");
  for (const auto& c : s["chips"]) {
    const auto& layers = c["layers"];
    char range[32];
    std::snprintf(range, sizeof(range), "[%d, %d)", layers[0].get<int>(),
                  layers[1].get<int>());
    std::printf("%-6s %-24s %7d %5d %5d %-9s %8.2f",
                c["chip"].get<std::string>().c_str(),
                c["device"].get<std::string>().c_str(), c["replica"].get<int>(),
                c["stage"].get<int>(), c["chunk"].get<int>(), range,
                c["throttle"].get<double>());
    if (c.contains("compute_factor"))
      std::printf(" %6.2fx %9.4f %10.1f", c["compute_factor"].get<double>(),
                  c["idle_seconds"].get<double>(),
                  c["peak_bytes"].get<double>() / (1 << 20));
    std::printf("\n");
  }
}

/// The endpoint's answer line as JSON: an object whose "ok" is a boolean.
json parse_answer(const std::string& line) {
  auto answer = json::parse(line, nullptr, false);
  if (answer.is_discarded() || !answer.is_object())
    throw bad_answer("not one JSON object: " + line.substr(0, 200));
  need(answer, "", "ok", 'b');
  return answer;
}

/// The endpoint's session (docs/admin.md, "The protocol").
std::string session_of(const endpoint& address, const deadline& by) {
  const auto answer = parse_answer(
    exchange(address, std::string(runtime::admin_session_query), by));
  const auto& session =
    need(need(answer, "", "result", 'o'), "session: ", "session", 's');
  if (!answer["ok"].get<bool>() ||
      !runtime::is_admin_session(session.get<std::string>()))
    throw bad_answer("session: not 32 hex digits");
  return session.get<std::string>();
}

/// --ca, --cert and --key (docs/admin.md, "TLS").
void add_tls_options(CLI::App& cli, apps::tls_client_options& tls) {
  cli
    .add_option("--ca", tls.ca,
                "Speak TLS, trusting the endpoint's certificate when this "
                "CA (a PEM file) signed it ([admin] certificate)")
    ->check(CLI::ExistingFile);
  auto* cert = cli
                 .add_option("--cert", tls.certificate,
                             "This client's certificate (PEM), for an "
                             "endpoint with an [admin] client_ca")
                 ->check(CLI::ExistingFile)
                 ->needs("--ca");
  auto* key =
    cli.add_option("--key", tls.key, "The private key of --cert (PEM)")
      ->check(CLI::ExistingFile);
  cert->needs(key);
  key->needs(cert);
}

} // namespace

int main(int argc, char** argv) {
  // A peer that closes while OpenSSL writes must be an error, not SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  endpoint at;
  std::string& address = at.address;
  std::string token_file;
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
  add_tls_options(cli, at.tls);
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
    if (!at.tls.ca.empty())
      at.context = std::make_shared<apps::tls_client_context>(at.tls);
    const auto seq = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::system_clock::now().time_since_epoch())
        .count());
    const deadline wait{clock::now() + std::chrono::seconds(timeout),
                        std::chrono::seconds(timeout)};
    json answer;
    try {
      const auto request = runtime::seal_admin_request(
        *token, seq, session_of(at, wait), command, std::move(args));
      const auto body = runtime::encode_admin_request(request);
      if (body.size() > runtime::max_admin_request_bytes)
        throw config_error(
          "", "the request takes " + std::to_string(body.size()) +
                " bytes; the endpoint takes at most " +
                std::to_string(runtime::max_admin_request_bytes >> 20) +
                " MiB");
      answer = parse_answer(exchange(at, body, wait));
      if (answer["ok"].get<bool>())
        checked_result(answer, command);
    } catch (const unreachable& e) {
      std::cerr << "h2-admin: error: " << e.what() << std::endl;
      return apps::exit_peer_failed;
    } catch (const bad_answer& e) {
      std::cerr << "h2-admin: error: not an H2 admin endpoint's answer: "
                << e.what() << std::endl;
      return apps::exit_peer_failed;
    }
    if (!answer["ok"].get<bool>()) {
      const auto error = answer.find("error");
      std::cerr << "h2-admin: refused: "
                << (error != answer.end() && error->is_string()
                      ? error->get<std::string>().substr(0, 4096)
                      : std::string("(no reason given)"))
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
