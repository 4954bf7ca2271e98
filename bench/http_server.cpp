// H2's HTTP server (metrics/http_server.hpp) against a minimal Asio server
// in the same run: requests per second for GET /metrics (a registry of 64
// labelled series) and for a sealed admin `status` (POST /admin through
// apps::admin_api, answered by a thread standing in for the scheduler),
// each over a new connection per request, as Prometheus and h2-admin make
// them. The baseline accepts, reads the head and writes a fixed answer,
// one connection at a time on one thread: what any HTTP server must do.
#include "bench_common.hpp"

#include "h2/apps/admin_api.hpp"
#include "h2/metrics/http_server.hpp"
#include "h2/metrics/registry.hpp"
#include "h2/runtime/admin.hpp"

#include <asio.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
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

/// Requests per second of `make_request()` sent to `port` for `seconds`.
template <class MakeRequest>
double rate(std::uint16_t port, double seconds, MakeRequest make_request,
            const char* expect) {
  const auto start = bench_clock::now();
  long n = 0;
  while (std::chrono::duration<double>(bench_clock::now() - start).count() <
         seconds) {
    const auto answer = one_request(port, make_request());
    H2_ENFORCE(answer.find(expect) != std::string::npos,
               "unexpected answer: ", answer.substr(0, 200));
    ++n;
  }
  return static_cast<double>(n) /
         std::chrono::duration<double>(bench_clock::now() - start).count();
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
    [] { return std::string("GET / HTTP/1.1\r\nHost: b\r\n\r\n"); }, "ok");

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
    [] { return std::string("GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n"); },
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
  const double sealed = rate(
    admin.port(), seconds,
    [&] {
      const auto body = runtime::encode_admin_request(
        runtime::seal_admin_request(key, ++seq, session, "status", {}));
      return "POST /admin HTTP/1.1\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\n\r\n" + body;
    },
    "\"ok\":true");
  answering = false;
  scheduler.join();
  inbox->close();

  records.push_back(
    {"http GET /metrics (64 series)", scrape, "req/s", baseline,
     scrape / baseline,
     "a connection per request; baseline: minimal Asio server"});
  records.push_back({"http sealed admin status", sealed, "req/s", baseline,
                     sealed / baseline,
                     "decode, HMAC, session, inbox round trip"});
  for (const auto& r : records)
    bench::print(r);
  if (!out.empty())
    bench::append_results(out, records);
  return 0;
}
