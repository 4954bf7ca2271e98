// The admin endpoint end to end (docs/admin.md): h2-admin steers a running
// h2-launch (pause, status, throttle, rebalance, policy, plan, resume,
// stop), and every request it must refuse (no token, a wrong token, a
// replay, garbage, an unknown command, values out of range) gets an error
// and a log line while training goes on exactly as without them.
#include "h2/runtime/admin.hpp"
#include "launch.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <regex>
#include <stdexcept>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace h2::test {
namespace {

using namespace std::chrono_literals;

const std::string admin_binary = H2_ADMIN;

/// small_job on the wall clock (about 0.3 s a step) with an admin token.
std::string admin_job(const std::filesystem::path& token, int steps) {
  auto job = replaced(small_job, "clock = \"virtual\"",
                      "clock = \"wall\"\ntime_scale = 400");
  job = replaced(job, "steps = 20", "steps = " + std::to_string(steps));
  return job + "\n[admin]\ntoken_file = \"" + token.string() + "\"\n";
}

std::filesystem::path write_token(const scratch_dir& dir,
                                  const std::string& name,
                                  const std::string& text, mode_t mode = 0600) {
  auto path = dir.write(name, text);
  ::chmod(path.c_str(), mode);
  return path;
}

/// The admin endpoint h2-launch printed ("h2: admin endpoint at H:P").
std::string endpoint_of(child_process& launch) {
  std::string where;
  const std::regex line(R"(admin endpoint at (\S+))");
  launch.wait_until(
    [&] {
      std::smatch m;
      const auto out = launch.out();
      if (!std::regex_search(out, m, line))
        return false;
      where = m[1];
      return true;
    },
    60s);
  return where;
}

int port_of(const std::string& endpoint) {
  return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
}

struct raw_answer {
  int status = 0; ///< the HTTP status
  std::string body;
};

/// POSTs `body` to the endpoint's /admin as any HTTP client would.
raw_answer raw_exchange(int port, const std::string& body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    throw std::runtime_error(std::strerror(errno));
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    throw std::runtime_error(std::strerror(errno));
  }
  const std::string out =
    "POST /admin HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) +
    "\r\n\r\n" + body;
  ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;)
    answer.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const auto end = answer.find("\r\n\r\n");
  if (answer.size() < 12 || end == std::string::npos)
    throw std::runtime_error("not an HTTP answer: " + answer.substr(0, 80));
  return {std::stoi(answer.substr(9, 3)), answer.substr(end + 4)};
}

/// The body of the endpoint's answer to `body`.
std::string raw_request(int port, const std::string& body) {
  return raw_exchange(port, body).body;
}

/// A CA and, signed by it, a certificate for 127.0.0.1 and a client's,
/// made by the openssl tool (PEM files in `dir`, named after `name`).
struct test_pki {
  std::filesystem::path ca, server, server_key, client, client_key;
};

test_pki make_pki(const scratch_dir& dir, const std::string& name) {
  const auto at = [&](const std::string& f) {
    return dir / (name + "-" + f);
  };
  const auto ext =
    dir.write(name + "-ext.cnf", "subjectAltName=IP:127.0.0.1\n");
  auto key = [&](const std::string& f) {
    return "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 "
           "-out " +
           at(f).string();
  };
  auto signed_by_ca = [&](const std::string& who, const std::string& cn,
                          bool san) {
    return key(who + ".key") + " && openssl req -new -key " +
           at(who + ".key").string() + " -subj /CN=" + cn + " -out " +
           at(who + ".csr").string() + " && openssl x509 -req -in " +
           at(who + ".csr").string() + " -CA " + at("ca.pem").string() +
           " -CAkey " + at("ca.key").string() +
           " -CAcreateserial -days 2 -out " + at(who + ".pem").string() +
           (san ? " -extfile " + ext.string() : std::string()) + " 2>/dev/null";
  };
  const std::string script =
    key("ca.key") + " && openssl req -x509 -new -key " + at("ca.key").string() +
    " -subj /CN=" + name + "-ca -days 2 -out " + at("ca.pem").string() +
    " && " + signed_by_ca("server", "127.0.0.1", true) + " && " +
    signed_by_ca("client", name + "-operator", false);
  const auto r = run_to_end("/bin/sh", {"-c", script}, dir, 60s);
  if (r.status.code != 0)
    throw std::runtime_error("openssl could not make the test CA: " + r.err);
  return {at("ca.pem"), at("server.pem"), at("server.key"), at("client.pem"),
          at("client.key")};
}

/// What `openssl s_client` (TLS `version`) gets back for a POST /admin to
/// 127.0.0.1:`port` presenting `pki`'s client certificate, the endpoint
/// checked against `ca`.
run_result s_client(const scratch_dir& dir, int port, const test_pki& pki,
                    const std::filesystem::path& ca, const char* version) {
  const auto request = dir.write(
    "request.txt", "POST /admin HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
  return run_to_end(
    "/usr/bin/openssl",
    {"s_client", "-connect", "127.0.0.1:" + std::to_string(port), version,
     "-CAfile", ca.string(), "-cert", pki.client.string(), "-key",
     pki.client_key.string(), "-verify_return_error", "-ign_eof", "-quiet"},
    dir, 30s, request);
}

class apps_admin : public ::testing::Test {
protected:
  /// h2-admin --address ... --token-file `token` [tls_...] args...
  run_result admin(const std::filesystem::path& token,
                   const std::vector<std::string>& args) {
    std::vector<std::string> all = {"--address", endpoint_, "--token-file",
                                    token.string()};
    all.insert(all.end(), tls_.begin(), tls_.end());
    all.insert(all.end(), args.begin(), args.end());
    return run_to_end(admin_binary, all, calls_, 60s);
  }

  /// Starts h2-launch on `job` with an admin endpoint on any free port and
  /// a JSON log at `log`, and waits for the endpoint.
  std::unique_ptr<child_process>
  start(const std::filesystem::path& job, const std::filesystem::path& log,
        const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {job.string(), "--admin-port", "0",
                                     "--json-log", log.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    ++launches_;
    auto launch = std::make_unique<child_process>(
      launch_binary, args, dir_ / ("stdout" + std::to_string(launches_)),
      dir_ / ("stderr" + std::to_string(launches_)));
    endpoint_ = endpoint_of(*launch);
    EXPECT_FALSE(endpoint_.empty()) << launch->out() << launch->err();
    return launch;
  }

  /// The steps the job has done; -1 until its run answers.
  int steps_done(const std::filesystem::path& token) {
    const auto r = admin(token, {"status", "--json"});
    return r.status.code == 0 ? nlohmann::json::parse(r.out)["step"].get<int>()
                              : -1;
  }

  /// The "status --json" answer.
  nlohmann::json status(const std::filesystem::path& token) {
    auto r = admin(token, {"status", "--json"});
    EXPECT_EQ(r.status.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  }

  scratch_dir dir_;
  scratch_dir calls_;
  std::string endpoint_;
  /// h2-admin's TLS flags for the endpoint (none: plain HTTP).
  std::vector<std::string> tls_;
  int launches_ = 0;
};

/// The session of the endpoint on `port`.
std::string session_at(int port) {
  const auto answer = nlohmann::json::parse(
    raw_request(port, std::string(runtime::admin_session_query)));
  return answer.at("result").at("session").get<std::string>();
}

TEST_F(apps_admin, an_admin_steers_a_running_job) {
  const auto token = write_token(dir_, "admin.token", "0123456789abcdef-x\n");
  const auto job = dir_.write("job.toml", admin_job(token, 100000));
  const auto log = dir_ / "log.jsonl";
  auto started = start(job, log);
  ASSERT_FALSE(endpoint_.empty());
  auto& launch = *started;

  // Paused: the step count holds still.
  auto paused = admin(token, {"pause"});
  ASSERT_EQ(paused.status.code, 0) << paused.err;
  ASSERT_TRUE(launch.wait_until(
    [&] { return status(token)["paused"].get<bool>(); }, 60s));
  const int held = status(token)["step"];
  std::this_thread::sleep_for(1s); // several steps' time
  EXPECT_EQ(status(token)["step"], held);

  // Throttled chip 0:0, then rebalanced around it.
  auto throttle = admin(token, {"throttle", "0:0", "3"});
  ASSERT_EQ(throttle.status.code, 0) << throttle.err;
  auto rebalance = admin(token, {"rebalance", "--auto"});
  ASSERT_EQ(rebalance.status.code, 0) << rebalance.err << rebalance.out;
  auto resumed = admin(token, {"resume"});
  ASSERT_EQ(resumed.status.code, 0) << resumed.err;
  ASSERT_TRUE(launch.wait_until(
    [&] { return status(token)["step"].get<int>() >= held + 3; }, 60s));
  const auto s = status(token);
  EXPECT_EQ(s["paused"], false);
  EXPECT_EQ(s["plan_generation"], 1);
  EXPECT_EQ(s["chips"][0]["chip"], "0:0");
  EXPECT_EQ(s["chips"][0]["throttle"], 3.0);
  EXPECT_GT(s["chips"][0]["compute_factor"].get<double>(), 2.5)
    << "the policy sees the throttle in what the chip charges";

  auto plan = admin(token, {"plan"});
  ASSERT_EQ(plan.status.code, 0) << plan.err;
  EXPECT_EQ(nlohmann::json::parse(plan.out)["generation"], 1);
  auto policy = admin(token, {"policy", "auto"});
  EXPECT_EQ(policy.status.code, 0) << policy.err;
  EXPECT_EQ(status(token)["policy"]["mode"], "auto");
  auto human = admin(token, {"status"});
  EXPECT_NE(human.out.find("0:0    emulated:h100-sxm"), std::string::npos)
    << human.out;

  // No [checkpoint]: refused, training goes on.
  auto checkpoint = admin(token, {"checkpoint"});
  EXPECT_EQ(checkpoint.status.code, 1);
  EXPECT_NE(checkpoint.err.find("no [checkpoint] dir"), std::string::npos)
    << checkpoint.err;

  auto stop = admin(token, {"stop"});
  ASSERT_EQ(stop.status.code, 0) << stop.err;
  auto end = launch.wait(run_timeout);
  EXPECT_EQ(end.code, 0) << end.describe() << launch.err();
  EXPECT_NE(launch.out().find("h2: stopped after"), std::string::npos);
  const auto rebalances = events(json_log(read_text(log)), "rebalance");
  ASSERT_GE(rebalances.size(), 1u);
  EXPECT_EQ(rebalances[0]["reason"], "admin");
  // Planned before the throttle showed in any step; once the policy is on
  // it works around what the chips then charge.
  for (std::size_t i = 1; i < rebalances.size(); ++i)
    EXPECT_EQ(rebalances[i]["reason"], "throttled chip 0:0");
  EXPECT_EQ(rebalances[0]["step"], held);
  EXPECT_GT(rebalances[0]["moved_bytes"].get<double>(), 0);
  EXPECT_LT(rebalances[0]["predicted_after_seconds"].get<double>(),
            rebalances[0]["predicted_before_seconds"].get<double>());
}

TEST_F(apps_admin, a_sigterm_stops_a_paused_job) {
  const auto token = write_token(dir_, "admin.token", "0123456789abcdef-z\n");
  const auto job = dir_.write("job.toml", admin_job(token, 100000));
  const auto log = dir_ / "log.jsonl";
  auto started = start(job, log);
  ASSERT_FALSE(endpoint_.empty());
  auto& launch = *started;
  ASSERT_EQ(admin(token, {"pause"}).status.code, 0);
  ASSERT_TRUE(
    launch.wait_until([&] { return status(token)["phase"] == "paused"; }, 60s));
  const int held = status(token)["step"];
  launch.send(SIGTERM); // no resume: the held boundary ends the run
  auto end = launch.wait(run_timeout);
  ASSERT_FALSE(end.timed_out) << "a paused job ignored SIGTERM";
  EXPECT_TRUE(end.exited && end.code == 128 + SIGTERM) << end.describe();
  EXPECT_NE(
    launch.out().find("h2: stopped after " + std::to_string(held) + " steps"),
    std::string::npos)
    << launch.out();
}

TEST_F(apps_admin, a_captured_request_is_refused_after_a_resume) {
  const std::string secret = "0123456789abcdef-r";
  const auto token = write_token(dir_, "admin.token", secret);
  const auto job =
    dir_.write("job.toml", admin_job(token, 100000) + "[checkpoint]\ndir = \"" +
                             (dir_ / "checkpoints").string() + "\"\n");
  const transport::job_secret key(secret);
  // An operator's stop, captured on the wire, sent once a step is done
  // (so that the stop saves a checkpoint to resume from): obeyed.
  auto first = start(job, dir_ / "first.jsonl");
  ASSERT_FALSE(endpoint_.empty());
  ASSERT_TRUE(first->wait_until([&] { return steps_done(token) >= 1; }, 60s));
  // Numbered as h2-admin numbers (above the status calls' numbers).
  const auto seq = static_cast<std::uint64_t>(
    std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::system_clock::now().time_since_epoch())
      .count());
  const std::string captured =
    runtime::encode_admin_request(runtime::seal_admin_request(
      key, seq, session_at(port_of(endpoint_)), "stop", {}));
  const auto stopped =
    nlohmann::json::parse(raw_request(port_of(endpoint_), captured));
  ASSERT_EQ(stopped["ok"], true) << stopped.dump();
  ASSERT_EQ(first->wait(run_timeout).code, 0) << first->err();

  // The job resumed from its checkpoint: the same bytes are refused, and
  // training goes on until a stop sealed for this run.
  auto second = start(job, dir_ / "second.jsonl", {"--resume", "latest"});
  ASSERT_FALSE(endpoint_.empty());
  const auto replayed =
    nlohmann::json::parse(raw_request(port_of(endpoint_), captured));
  EXPECT_EQ(replayed["ok"], false);
  EXPECT_NE(replayed.value("error", "").find("another run"), std::string::npos)
    << replayed.dump();
  EXPECT_TRUE(second->running()) << second->err();
  run_result stop;
  ASSERT_TRUE(second->wait_until(
    [&] {
      stop = admin(token, {"stop"});
      return stop.status.code == 0 ||
             stop.err.find("starting") == std::string::npos;
    },
    60s));
  ASSERT_EQ(stop.status.code, 0) << stop.err;
  ASSERT_EQ(second->wait(run_timeout).code, 0) << second->err();
  EXPECT_NE(second->out().find("h2: stopped after"), std::string::npos);
}

/// A fake admin endpoint: answers the session query as a job does, and
/// every other request with 200 and `hostile` as the body (or, when
/// `drip`, one byte of it every 100 ms), until the test ends.
class fake_endpoint {
public:
  explicit fake_endpoint(std::string hostile, bool drip = false)
      : hostile_(std::move(hostile)), drip_(drip) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error(std::strerror(errno));
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_endpoint() {
    done_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

private:
  /// The body of the HTTP request on `c` (its Content-Length bytes).
  static std::string request_body(int c) {
    std::string in;
    char ch = 0;
    while (in.find("\r\n\r\n") == std::string::npos &&
           ::recv(c, &ch, 1, 0) == 1)
      in.push_back(ch);
    const auto at = in.find("Content-Length: ");
    std::size_t length =
      at == std::string::npos ? 0 : std::stoul(in.substr(at + 16));
    std::string body;
    while (body.size() < length && ::recv(c, &ch, 1, 0) == 1)
      body.push_back(ch);
    return body;
  }

  void serve() {
    while (!done_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) != 1)
        continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0)
        continue;
      const std::string line = request_body(c);
      const bool asks_session = line == runtime::admin_session_query;
      const std::string head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n";
      ::send(c, head.data(), head.size(), MSG_NOSIGNAL);
      const std::string out =
        asks_session
          ? R"({"ok":true,"result":{"session":"00112233445566778899aabbccddeeff"}})"
          : hostile_;
      for (std::size_t at = 0; at < out.size() && !done_;) {
        const std::size_t n = drip_ ? 1 : out.size() - at;
        const ssize_t sent = ::send(c, out.data() + at, n, MSG_NOSIGNAL);
        if (sent <= 0)
          break; // h2-admin gave up
        at += static_cast<std::size_t>(sent);
        if (drip_ && !asks_session)
          std::this_thread::sleep_for(100ms);
      }
      ::close(c);
    }
  }

  std::string hostile_;
  bool drip_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST_F(apps_admin, hostile_answers_give_an_error_not_a_crash) {
  const auto token = write_token(dir_, "admin.token", "0123456789abcdef-h\n");
  struct hostile_case {
    std::vector<std::string> command;
    std::string answer;
    int code;
    std::string says;
  };
  const std::vector<hostile_case> cases = {
    {{"plan"}, "{\"ok\":true}\n", 3, "\"result\" is not an object"},
    {{"plan"},
     "{\"ok\":true,\"result\":{\"generation\":1}}\n",
     3,
     "plan: \"step\" is not an integer"},
    {{"status"},
     "{\"ok\":true,\"result\":{\"job\":\"j\",\"schedule\":\"1f1b\"}}\n",
     3,
     "status: \"phase\" is not a string"},
    {{"status"},
     R"({"ok":true,"result":{"job":"j","schedule":"1f1b","phase":"running",)"
     R"("step":1,"steps":2,"plan_generation":0,"last_step_seconds":1,)"
     R"("chips":[{"chip":"0:0","device":"d","replica":0,"stage":0,)"
     R"("chunk":0,"throttle":1,"layers":[0,1],"compute_factor":1}]}})"
     "\n",
     3,
     "\"idle_seconds\" is not a number"},
    {{"stop"}, "{\"ok\":\"yes\"}\n", 3, "\"ok\" is not true or false"},
    {{"stop"}, "{\"ok\":false}\n", 1, "(no reason given)"},
    {{"stop"}, "[1,2]\n", 3, "not one JSON object"},
    {{"status"},
     std::string(std::size_t{200} << 20, 'x'),
     3,
     "larger than 64 MiB"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.answer.substr(0, 60));
    fake_endpoint fake(c.answer);
    std::vector<std::string> args = {"--address", fake.address(),
                                     "--token-file", token.string()};
    args.insert(args.end(), c.command.begin(), c.command.end());
    const auto r = run_to_end(admin_binary, args, calls_, 60s);
    EXPECT_EQ(r.status.code, c.code) << r.status.describe() << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    expect_one_line(r.err);
  }
  // An answer that never ends keeps to --timeout, however it trickles.
  fake_endpoint slow(std::string(1000, ' '), true);
  const auto r = run_to_end(admin_binary,
                            {"--address", slow.address(), "--token-file",
                             token.string(), "--timeout", "2", "status"},
                            calls_, 60s);
  EXPECT_EQ(r.status.code, 3) << r.status.describe() << r.err;
  EXPECT_NE(r.err.find("within 2 s"), std::string::npos) << r.err;
}

TEST_F(apps_admin, silent_connections_keep_no_one_out) {
  // Over TLS with client certificates: a silent connection holds a
  // handshake open, the most a TLS server gives a stranger.
  const auto token = write_token(dir_, "admin.token", "0123456789abcdef-f\n");
  const auto pki = make_pki(dir_, "flood");
  const auto job = dir_.write(
    "job.toml", replaced(admin_job(token, 100000), "[admin]\n",
                         "[admin]\ncertificate = \"" + pki.server.string() +
                           "\"\nkey = \"" + pki.server_key.string() +
                           "\"\nclient_ca = \"" + pki.ca.string() + "\"\n"));
  tls_ = {"--ca",  pki.ca.string(),        "--cert", pki.client.string(),
          "--key", pki.client_key.string()};
  auto started = start(job, dir_ / "log.jsonl", {"--metrics-port", "0"});
  ASSERT_FALSE(endpoint_.empty());
  auto& launch = *started;
  const int port = port_of(endpoint_);
  std::smatch m;
  const auto out = launch.out();
  ASSERT_TRUE(std::regex_search(
    out, m, std::regex(R"(metrics at http://\S+:(\d+)/metrics)")))
    << out;
  const int metrics_port = std::stoi(m[1]);
  ASSERT_TRUE(launch.wait_until([&] { return steps_done(token) >= 1; }, 60s));
  // 40 connections that send nothing, reopened as the server drops them.
  std::atomic<bool> flooding{true};
  std::thread flood([&] {
    // 40 on the admin endpoint, 40 on /metrics.
    std::vector<int> silent(80, -1);
    while (flooding.load()) {
      for (std::size_t i = 0; i < silent.size(); ++i) {
        auto& fd = silent[i];
        char probe = 0;
        if (fd >= 0 && ::recv(fd, &probe, 1, MSG_DONTWAIT) != 0)
          continue; // still open (EAGAIN)
        if (fd >= 0)
          ::close(fd);
        fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port =
          htons(static_cast<std::uint16_t>(i < 40 ? port : metrics_port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
      }
      std::this_thread::sleep_for(50ms);
    }
    for (int fd : silent)
      if (fd >= 0)
        ::close(fd);
  });
  const int before = status(token)["step"];
  // A sealed status answers within h2-admin's deadline of 2 s, each time,
  // and Prometheus still scrapes.
  for (int i = 0; i < 3; ++i) {
    const auto r = admin(token, {"--timeout", "2", "status", "--json"});
    EXPECT_EQ(r.status.code, 0) << r.err;
    EXPECT_EQ(http_get(metrics_port, "/metrics").rfind("HTTP/1.1 200", 0), 0u);
    std::this_thread::sleep_for(1s);
  }
  EXPECT_TRUE(launch.wait_until(
    [&] { return status(token)["step"].get<int>() > before + 2; }, 60s))
    << "the job trains on";
  flooding.store(false);
  flood.join();
  ASSERT_EQ(admin(token, {"stop"}).status.code, 0);
  EXPECT_EQ(launch.wait(run_timeout).code, 0) << launch.err();
}

TEST_F(apps_admin, over_tls_only_clients_of_its_ca_are_answered) {
  const auto token = write_token(dir_, "admin.token", "0123456789abcdef-t\n");
  const auto ours = make_pki(dir_, "ours"), theirs = make_pki(dir_, "theirs");
  const auto job = dir_.write(
    "job.toml", replaced(admin_job(token, 100000), "[admin]\n",
                         "[admin]\ncertificate = \"" + ours.server.string() +
                           "\"\nkey = \"" + ours.server_key.string() +
                           "\"\nclient_ca = \"" + ours.ca.string() + "\"\n"));
  auto started = start(job, dir_ / "log.jsonl");
  ASSERT_FALSE(endpoint_.empty());
  auto& launch = *started;
  EXPECT_NE(launch.out().find(endpoint_ + " (TLS)"), std::string::npos);
  const int port = port_of(endpoint_);
  // openssl s_client with our client certificate gets an HTTP answer (the
  // empty request is refused by the job, 400); with another CA's, over TLS
  // 1.2 and 1.3, none.
  for (const char* version : {"-tls1_2", "-tls1_3"}) {
    const auto ok = s_client(calls_, port, ours, ours.ca, version);
    EXPECT_NE(ok.out.find("HTTP/1.1 400"), std::string::npos)
      << version << ": " << ok.out << ok.err;
    const auto refused = s_client(calls_, port, theirs, ours.ca, version);
    EXPECT_EQ(refused.out.find("HTTP/1.1"), std::string::npos)
      << version << ": " << refused.out;
    EXPECT_NE(refused.err.find("alert"), std::string::npos)
      << version << ": " << refused.err;
  }
  // h2-admin: with our CA and client certificate it steers the job; without
  // TLS, without a certificate, with another CA's certificate, or trusting
  // another CA, it gets nothing (exit 3).
  tls_ = {"--ca",  ours.ca.string(),        "--cert", ours.client.string(),
          "--key", ours.client_key.string()};
  ASSERT_TRUE(launch.wait_until([&] { return steps_done(token) >= 1; }, 60s));
  const std::vector<std::pair<std::vector<std::string>, std::string>>
    strangers = {{{}, ""}, // a failed handshake: a reset or an alert
                 {{"--ca", ours.ca.string()}, "alert"},
                 {{"--ca", ours.ca.string(), "--cert", theirs.client.string(),
                   "--key", theirs.client_key.string()},
                  "alert"},
                 {{"--ca", theirs.ca.string(), "--cert", ours.client.string(),
                   "--key", ours.client_key.string()},
                  "not trusted"}};
  for (const auto& [flags, says] : strangers) {
    tls_ = flags;
    const auto r = admin(token, {"--timeout", "5", "status"});
    EXPECT_EQ(r.status.code, 3) << r.out << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  }
  // A CA file that is not one is bad usage, found before anything is sent.
  tls_ = {"--ca", token.string()};
  const auto bad_ca = admin(token, {"status"});
  EXPECT_EQ(bad_ca.status.code, 2) << bad_ca.err;
  EXPECT_NE(bad_ca.err.find("--ca"), std::string::npos) << bad_ca.err;
  tls_ = {"--ca",  ours.ca.string(),        "--cert", ours.client.string(),
          "--key", ours.client_key.string()};
  ASSERT_EQ(admin(token, {"stop"}).status.code, 0);
  EXPECT_EQ(launch.wait(run_timeout).code, 0) << launch.err();
}

TEST_F(apps_admin, refused_requests_change_nothing) {
  const std::string secret = "0123456789abcdef-y";
  const auto token = write_token(dir_, "admin.token", secret);
  const auto wrong = write_token(dir_, "wrong.token", "fedcba9876543210-y");
  const auto shared = write_token(dir_, "shared.token", secret, 0644);
  const auto short_token = write_token(dir_, "short.token", "short");
  const int steps = 25;
  const auto job = dir_.write("job.toml", admin_job(token, steps));

  // The same job without an admin endpoint: the losses to match.
  scratch_dir quiet;
  const auto baseline_log = quiet / "log.jsonl";
  auto baseline = run_to_end(
    launch_binary, {job.string(), "--json-log", baseline_log.string()}, quiet,
    run_timeout);
  ASSERT_EQ(baseline.status.code, 0) << baseline.err;

  const auto log = dir_ / "log.jsonl";
  auto started = start(job, log);
  ASSERT_FALSE(endpoint_.empty());
  auto& launch = *started;
  const int port = port_of(endpoint_);
  const transport::job_secret key(secret);
  std::uint64_t seq = 1;
  // A request line sealed with the right token, each with the next seq.
  const auto session = session_at(port);
  auto sealed = [&](const std::string& command,
                    std::vector<std::string> args = {}) {
    return runtime::encode_admin_request(runtime::seal_admin_request(
      key, ++seq, session, command, std::move(args)));
  };
  auto answer_to = [&](const std::string& line) {
    return nlohmann::json::parse(raw_request(port, line));
  };
  // Held paused while the requests come in, however slowly (sanitizer
  // builds start each h2-admin in seconds): the job cannot end under them.
  // The endpoint is up before the run is: until the run opens, a command is
  // refused as "in progress (it is starting, or ending)"; ask again.
  nlohmann::json paused;
  ASSERT_TRUE(launch.wait_until(
    [&] {
      paused = answer_to(sealed("pause"));
      return paused["ok"] == true ||
             paused.value("error", "").find("starting") == std::string::npos;
    },
    60s));
  ASSERT_EQ(paused["ok"], true) << paused.dump();

  // Refused by h2-admin itself (exit 2, nothing sent).
  for (const auto& [file, reason] :
       std::vector<std::pair<std::filesystem::path, std::string>>{
         {dir_ / "none.token", "cannot read the admin token"},
         {shared, "readable by group or others"},
         {short_token, "at least 16"}}) {
    auto r = admin(file, {"stop"});
    EXPECT_EQ(r.status.code, 2) << file;
    EXPECT_NE(r.err.find(reason), std::string::npos) << r.err;
    expect_one_line(r.err);
  }
  auto usage = admin(token, {"throttle", "0:0", "0"});
  EXPECT_EQ(usage.status.code, 2);
  EXPECT_NE(usage.err.find("(0, 1000]"), std::string::npos) << usage.err;

  // Refused by the endpoint (exit 1 from h2-admin, an error line raw).
  auto unauthorized = admin(wrong, {"stop"});
  EXPECT_EQ(unauthorized.status.code, 1);
  EXPECT_NE(unauthorized.err.find("unauthorized"), std::string::npos)
    << unauthorized.err;
  auto refused = [&](const std::string& line, const std::string& reason) {
    const auto answer = answer_to(line);
    EXPECT_EQ(answer["ok"], false) << line.substr(0, 80);
    EXPECT_NE(answer.value("error", "").find(reason), std::string::npos)
      << answer.dump();
  };
  refused("stop now please", "malformed request");
  refused("{\"seq\": 1}", "malformed request");
  EXPECT_EQ(raw_exchange(port, std::string(2 << 20, 'x')).status, 413);
  refused(sealed("frob"), "unknown command");
  refused(sealed("throttle", {"0:0", "0"}), "(0, 1000]");
  refused(sealed("throttle", {"7:0", "2"}), "no chip 7:0");
  const auto status_line = sealed("status");
  EXPECT_EQ(answer_to(status_line)["ok"], true);
  refused(status_line, "unauthorized"); // the same request again: a replay
  auto forged = runtime::seal_admin_request(key, ++seq, session, "pause", {});
  forged.command = "stop";
  refused(runtime::encode_admin_request(forged), "unauthorized");
  ASSERT_EQ(answer_to(sealed("resume"))["ok"], true);

  auto end = launch.wait(run_timeout);
  ASSERT_EQ(end.code, 0) << end.describe() << launch.err();
  EXPECT_NE(launch.out().find("h2: done after " + std::to_string(steps)),
            std::string::npos);
  EXPECT_EQ(logged_losses(log), logged_losses(baseline_log))
    << "training went on exactly as without the requests";
  EXPECT_NE(launch.err().find("h2: admin: refused"), std::string::npos)
    << "refusals are logged";
}

} // namespace
} // namespace h2::test
