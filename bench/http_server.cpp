// H2's HTTP server (metrics/http_server.hpp) against a minimal Asio server
// in the same run: requests per second for GET /metrics (a registry of 64
// labelled series), for a sealed admin `status` (POST /admin through
// apps::admin_api, answered by a thread standing in for the scheduler),
// the same over TLS (a certificate the openssl tool makes, h2-admin's TLS
// client), and for the live page's GET /api/state (the demo's plan, 1,000
// steps recorded), each over a new connection per request, as Prometheus,
// h2-admin and a browser's refresh make them. The baseline accepts, reads
// the head and writes a fixed answer, one connection at a time on one
// thread: what any HTTP server must do.
#include "bench_common.hpp"

#include "h2/apps/admin_api.hpp"
#include "h2/apps/live_page.hpp"
#include "h2/apps/tls_client.hpp"
#include "h2/metrics/http_server.hpp"
#include "h2/metrics/registry.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <asio.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

namespace {

using asio::ip::tcp;
using bench_clock = std::chrono::steady_clock;

/// One request on a new connection; the whole answer.
std::string one_request(std::uint16_t port, const std::string& request) {
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(socket, asio::buffer(request));
  std::string answer;
  asio::error_code ec;
  asio::read(socket, asio::dynamic_buffer(answer), ec);
  return answer;
}

/// One request on a new TLS connection (h2-admin's client); the whole
/// answer.
std::string one_tls_request(std::uint16_t port, const std::string& request,
                            const h2::apps::tls_client_context& ctx) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  H2_ENFORCE(fd >= 0 &&
               ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0,
             "cannot connect to port ", port);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  const auto until = bench_clock::now() + std::chrono::seconds(10);
  std::string answer;
  {
    h2::apps::tls_client tls(fd, "127.0.0.1", ctx, until);
    tls.write_all(request, until);
    char buf[4096];
    while (const auto n = tls.read_some(buf, sizeof buf, until))
      answer.append(buf, n);
  }
  ::close(fd);
  return answer;
}

/// Requests per second of `send(make_request())` for `seconds`.
template <class Send, class MakeRequest>
double rate(Send send, double seconds, MakeRequest make_request,
            const char* expect) {
  const auto start = bench_clock::now();
  long n = 0;
  while (std::chrono::duration<double>(bench_clock::now() - start).count() <
         seconds) {
    const auto answer = send(make_request());
    H2_ENFORCE(answer.find(expect) != std::string::npos,
               "unexpected answer: ", answer.substr(0, 200));
    ++n;
  }
  return static_cast<double>(n) /
         std::chrono::duration<double>(bench_clock::now() - start).count();
}

template <class MakeRequest>
double rate(std::uint16_t port, double seconds, MakeRequest make_request,
            const char* expect) {
  return rate([port](const std::string& r) { return one_request(port, r); },
              seconds, make_request, expect);
}

/// A self-signed certificate for 127.0.0.1 in `dir` (cert.pem, key.pem),
/// made by the openssl tool.
void make_certificate(const std::filesystem::path& dir) {
  const auto command =
    "/usr/bin/openssl req -x509 -newkey ec -pkeyopt "
    "ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=127.0.0.1 "
    "-addext subjectAltName=IP:127.0.0.1 -keyout " +
    (dir / "key.pem").string() + " -out " + (dir / "cert.pem").string() +
    " 2>/dev/null";
  H2_ENFORCE(std::system(command.c_str()) == 0,
             "openssl could not make a certificate: ", command);
}

/// The baseline: accept, read to the blank line, answer, close.
class echo_server {
public:
  echo_server() : acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    thread_ = std::thread([this] {
      while (!done_) {
        tcp::socket s(io_);
        asio::error_code ec;
        acceptor_.accept(s, ec);
        if (ec || done_)
          continue;
        std::string in;
        asio::read_until(s, asio::dynamic_buffer(in), "\r\n\r\n", ec);
        static const std::string out = "HTTP/1.1 200 OK\r\nContent-Length: "
                                       "3\r\nConnection: close\r\n\r\nok\n";
        asio::write(s, asio::buffer(out), ec);
        s.shutdown(tcp::socket::shutdown_both, ec);
      }
    });
  }
  ~echo_server() {
    done_ = true;
    try {
      one_request(port(), "GET / HTTP/1.1\r\n\r\n"); // wakes the accept
    } catch (const std::exception&) {
    }
    thread_.join();
  }
  std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

private:
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

} // namespace

int main(int argc, char** argv) {
  using namespace h2;
  const double seconds = 3;
  const auto out = bench::out_path(argc, argv);
  std::vector<bench::record> records;
  echo_server echo;
  const double baseline = rate(
    echo.port(), seconds,
    [] { return std::string("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); },
    "ok");

  metrics::registry registry;
  for (int c = 0; c < 64; ++c)
    registry
      .get_counter("h2_bench_steps_total", "steps",
                   {{"chip", "0:" + std::to_string(c)}})
      .inc(c);
  metrics::http_server server("127.0.0.1", 0,
                              [&] { return registry.expose(); });
  const double scrape = rate(
    server.port(), seconds,
    [] {
      return std::string("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    },
    "h2_bench_steps_total");

  // The admin API, answered at once by a stand-in for the scheduler.
  auto inbox = std::make_shared<runtime::admin_inbox>();
  std::atomic<bool> answering{true};
  inbox->open([] {});
  std::thread scheduler([&] {
    while (answering)
      for (auto& c : inbox->take())
        c.reply->set_value({true, "{\"step\":1}"});
  });
  const std::string secret = "bench-admin-token-0123456789";
  apps::admin_api api(std::make_shared<const transport::job_secret>(secret),
                      inbox, std::fopen("/dev/null", "w"));
  metrics::http_server admin("127.0.0.1", 0, {api.route()});
  const auto session_answer = one_request(
    admin.port(), "POST /admin HTTP/1.1\r\nContent-Length: " +
                    std::to_string(runtime::admin_session_query.size()) +
                    "\r\n\r\n" + std::string(runtime::admin_session_query));
  const auto at = session_answer.find("\"session\":\"");
  H2_ENFORCE(at != std::string::npos, "no session: ", session_answer);
  const auto session = session_answer.substr(at + 11, 32);
  const transport::job_secret key(secret);
  std::uint64_t seq = 0;
  // A sealed `status`, each with the next sequence number.
  auto sealed_status = [&] {
    const auto body = runtime::encode_admin_request(
      runtime::seal_admin_request(key, ++seq, session, "status", {}));
    return "POST /admin HTTP/1.1\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  const double sealed =
    rate(admin.port(), seconds, sealed_status, "\"ok\":true");
  // The same over TLS: a handshake per connection, as h2-admin makes it.
  const auto pki = std::filesystem::temp_directory_path() /
                   ("h2-bench-tls-" + std::to_string(::getpid()));
  std::filesystem::create_directories(pki);
  make_certificate(pki);
  metrics::http_server admin_tls("127.0.0.1", 0, {api.route()},
                                 metrics::http_tls{(pki / "cert.pem").string(),
                                                   (pki / "key.pem").string(),
                                                   ""});
  const apps::tls_client_context client({(pki / "cert.pem").string(), "", ""});
  const double sealed_tls = rate(
    [&](const std::string& r) {
      return one_tls_request(admin_tls.port(), r, client);
    },
    seconds, sealed_status, "\"ok\":true");
  std::filesystem::remove_all(pki);
  answering = false;
  scheduler.join();
  inbox->close();

  // The live page's data: the demo's plan and 1,000 steps recorded.
  const auto job = parse_job(demo_job_toml(), "demo.toml");
  const auto p = scheduler::make_plan(job);
  runtime::run_view view(job, 1000);
  view.on_setup(p, {});
  for (int s = 0; s < 1000; ++s) {
    runtime::step_summary step;
    step.step = s;
    step.loss = 4.0 - s * 1e-3;
    step.tokens_per_second = 3000;
    for (const auto& st : p.replicas.front().stages) {
      runtime::chip_step_stats c;
      c.chip = st.chip;
      c.stage = static_cast<int>(step.chips.size());
      step.chips.push_back(c);
    }
    view.on_step(step);
  }
  metrics::http_server page("127.0.0.1", 0,
                            apps::live_page_routes(view, std::nullopt));
  const double state = rate(
    page.port(), seconds,
    [] {
      return std::string("GET /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    },
    "\"steps_done\":1000");

  records.push_back(
    {"http GET /metrics (64 series)", scrape, "req/s", baseline,
     scrape / baseline,
     "a connection per request; baseline: minimal Asio server"});
  records.push_back({"http sealed admin status", sealed, "req/s", baseline,
                     sealed / baseline,
                     "decode, HMAC, session, inbox round trip"});
  records.push_back({"http sealed admin status over TLS", sealed_tls, "req/s",
                     baseline, sealed_tls / baseline,
                     "the same with a TLS 1.3 handshake per connection "
                     "(P-256); baseline: the plain minimal server"});
  records.push_back({"http live page GET /api/state", state, "req/s", baseline,
                     state / baseline,
                     "JSON of the demo's plan, 4 chips, 1,000 steps"});
  for (const auto& r : records)
    bench::print(r);
  if (!out.empty())
    bench::append_results(out, records);
  return 0;
}
