// The /metrics endpoint, driven by real client sockets on 127.0.0.1. Every
// wait has a generous deadline so that a bug fails a test instead of hanging
// it; no test asserts how fast anything is.
#include "h2/metrics/http_server.hpp"

#include "h2/core/error.hpp"
#include "h2/metrics/registry.hpp"

#include <asio.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace h2::metrics {
namespace {

using asio::ip::tcp;
using namespace std::chrono_literals;

constexpr auto deadline = 20s;

tcp::endpoint server_endpoint(std::uint16_t port) {
  return {asio::ip::make_address("127.0.0.1"), port};
}

struct reply {
  bool finished = false; ///< the server closed before the deadline
  std::string raw;       ///< everything received
  int status = 0;
  std::map<std::string, std::string> headers; ///< names lower-cased
  std::string body;
};

void parse(reply& r) {
  auto end = r.raw.find("\r\n\r\n");
  if (r.raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos)
    return;
  r.status = std::stoi(r.raw.substr(9, 3));
  r.body = r.raw.substr(end + 4);
  std::size_t pos = r.raw.find("\r\n") + 2;
  while (pos < end) {
    auto eol = r.raw.find("\r\n", pos);
    auto line = r.raw.substr(pos, eol - pos);
    auto colon = line.find(':');
    auto name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    auto value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(' '));
    r.headers[name] = value;
    pos = eol + 2;
  }
}

/// Sends `request` on a new connection and reads until the server closes
/// it, or until the deadline passes.
reply send_request(std::uint16_t port, const std::string& request) {
  asio::io_context io;
  tcp::socket socket(io);
  reply r;
  socket.async_connect(server_endpoint(port), [&](asio::error_code ec) {
    if (ec) {
      r.finished = true;
      return;
    }
    asio::async_write(socket, asio::buffer(request),
                      [&](asio::error_code, std::size_t) {
                        // Read even if the write failed: the server may have
                        // answered and closed before taking the whole request
                        // (431).
                        asio::async_read(socket, asio::dynamic_buffer(r.raw),
                                         [&](asio::error_code, std::size_t) {
                                           r.finished = true;
                                         });
                      });
  });
  io.run_for(deadline);
  parse(r);
  return r;
}

reply get(std::uint16_t port, const std::string& target,
          const std::string& method = "GET") {
  return send_request(port, method + " " + target +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              "User-Agent: h2-test\r\n\r\n");
}

/// A connected client that sends nothing.
class silent_client {
public:
  explicit silent_client(std::uint16_t port) : socket_(io_) {
    socket_.connect(server_endpoint(port));
  }

  /// Sends `data` and nothing more.
  void send(const std::string& data) {
    asio::write(socket_, asio::buffer(data));
  }

  /// Waits (up to the deadline) for the server to close the connection;
  /// true when it did.
  bool closed_by_server() {
    bool closed = false;
    std::array<char, 256> buf;
    std::function<void(asio::error_code, std::size_t)> on_read =
      [&](asio::error_code ec, std::size_t) {
        if (ec) {
          closed = true;
          return;
        }
        socket_.async_read_some(asio::buffer(buf), on_read);
      };
    socket_.async_read_some(asio::buffer(buf), on_read);
    io_.restart();
    io_.run_for(deadline);
    return closed;
  }

private:
  asio::io_context io_;
  tcp::socket socket_;
};

class metrics_http_server_test : public ::testing::Test {
protected:
  void SetUp() override {
    registry_.get_counter("h2_steps_total", "Steps.", {{"chip", "0:0"}}).inc(3);
    registry_.get_gauge("h2_memory_used_bytes", "Memory.").set(1.5e9);
    registry_.get_histogram("h2_step_seconds", "Step.", {0.1, 1}).observe(0.3);
    server_ = std::make_unique<http_server>("127.0.0.1", 0, [this] {
      ++scrapes_;
      return registry_.expose();
    });
    port_ = server_->port();
    ASSERT_NE(port_, 0);
  }

  registry registry_;
  std::atomic<int> scrapes_{0};
  std::unique_ptr<http_server> server_;
  std::uint16_t port_ = 0;
};

TEST_F(metrics_http_server_test, get_metrics_serves_the_exposition) {
  auto r = get(port_, "/metrics");
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"],
            "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.headers["connection"], "close");
  EXPECT_EQ(r.headers["content-length"], std::to_string(r.body.size()));
  EXPECT_EQ(r.body, registry_.expose());
  EXPECT_EQ(scrapes_, 1);

  // A query string does not change the resource.
  EXPECT_EQ(get(port_, "/metrics?debug=1").status, 200);
}

TEST_F(metrics_http_server_test, head_sends_headers_only) {
  auto r = get(port_, "/metrics", "HEAD");
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers["content-length"],
            std::to_string(registry_.expose().size()));
  EXPECT_EQ(r.body, "");
}

TEST_F(metrics_http_server_test, index_links_to_metrics) {
  auto r = get(port_, "/");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_NE(r.body.find("href=\"/metrics\""), std::string::npos) << r.body;
  EXPECT_EQ(scrapes_, 0);
}

TEST_F(metrics_http_server_test, unknown_path_is_404) {
  for (auto target : {"/nope", "/metrics/", "/metricsx", "/../metrics"}) {
    auto r = get(port_, target);
    EXPECT_EQ(r.status, 404) << target << "\n" << r.raw;
    EXPECT_EQ(r.headers["content-length"], std::to_string(r.body.size()));
  }
  EXPECT_EQ(scrapes_, 0);
}

TEST_F(metrics_http_server_test, other_methods_are_405) {
  for (auto method : {"POST", "PUT", "DELETE", "OPTIONS", "BREW"}) {
    auto r = get(port_, "/metrics", method);
    EXPECT_EQ(r.status, 405) << method << "\n" << r.raw;
    EXPECT_EQ(r.headers["allow"], "GET, HEAD");
  }
  // A POST with a body the server never reads still gets its answer.
  auto r = send_request(port_, "POST /metrics HTTP/1.1\r\nContent-Length: 20000"
                               "\r\n\r\n" +
                                 std::string(20000, 'x'));
  EXPECT_EQ(r.status, 405) << r.raw;
  EXPECT_EQ(scrapes_, 0);
}

TEST_F(metrics_http_server_test, malformed_requests_are_400) {
  for (const std::string& request : std::vector<std::string>{
         "\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n",
         "GET  /metrics HTTP/1.1\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n",
         "G(T /metrics HTTP/1.1\r\n\r\n", "GET /metrics FTP/1.0\r\n\r\n",
         std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n\n", 13)}) {
    auto r = send_request(port_, request);
    EXPECT_TRUE(r.finished);
    EXPECT_EQ(r.status, 400) << request << "\n" << r.raw;
  }
  EXPECT_EQ(send_request(port_, "GET /metrics HTTP/2.0\r\n\r\n").status, 505);
  // HTTP/1.0 and bare line feeds are served.
  EXPECT_EQ(send_request(port_, "GET /metrics HTTP/1.0\n\n").status, 200);
  EXPECT_EQ(
    send_request(port_, "GET http://h:1/metrics HTTP/1.1\r\n\r\n").status, 200);
}

TEST_F(metrics_http_server_test, oversized_head_is_rejected) {
  // Within the limit: served.
  std::string big_header(6000, 'a');
  auto ok = send_request(
    port_, "GET /metrics HTTP/1.1\r\nX-Big: " + big_header + "\r\n\r\n");
  EXPECT_EQ(ok.status, 200) << ok.raw.substr(0, 200);
  // Over it, with or without an end: 431, and the server never scrapes.
  int before = scrapes_;
  std::string huge(http_server::max_request_head_bytes * 2, 'a');
  auto r =
    send_request(port_, "GET /metrics HTTP/1.1\r\nX-Big: " + huge + "\r\n\r\n");
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.status, 431) << r.raw.substr(0, 200);
  auto endless = send_request(port_, "GET /metrics HTTP/1.1\r\n" + huge);
  EXPECT_TRUE(endless.finished);
  EXPECT_EQ(endless.status, 431) << endless.raw.substr(0, 200);
  EXPECT_EQ(scrapes_, before);
  // And it still serves.
  EXPECT_EQ(get(port_, "/metrics").status, 200);
}

TEST_F(metrics_http_server_test,
       silent_client_does_not_block_others_and_is_dropped) {
  silent_client silent(port_);
  silent_client half(port_);
  half.send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n");
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(get(port_, "/metrics").status, 200);
  // Dropped after http_server::request_timeout; the deadline is far longer.
  EXPECT_TRUE(silent.closed_by_server());
  EXPECT_TRUE(half.closed_by_server());
  EXPECT_EQ(get(port_, "/metrics").status, 200);
}

TEST_F(metrics_http_server_test, clients_that_vanish_do_not_hurt) {
  for (int i = 0; i < 20; ++i) {
    asio::io_context io;
    tcp::socket s(io);
    s.connect(server_endpoint(port_));
    if (i % 2 == 1)
      asio::write(s, asio::buffer(std::string("GET /metr")));
    // Reset instead of a clean close for some.
    if (i % 4 < 2)
      s.set_option(asio::socket_base::linger(true, 0));
    s.close();
  }
  EXPECT_EQ(get(port_, "/metrics").status, 200);
}

TEST_F(metrics_http_server_test, concurrent_clients_are_all_served) {
  constexpr int threads = 8;
  constexpr int per_thread = 10;
  std::atomic<int> ok{0};
  std::vector<std::thread> pool;
  pool.reserve(threads);
  auto expected = registry_.expose();
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) {
        auto r = get(port_, "/metrics");
        if (r.status == 200 && r.body == expected)
          ++ok;
      }
    });
  for (auto& t : pool)
    t.join();
  EXPECT_EQ(ok, threads * per_thread);
  EXPECT_EQ(scrapes_, threads * per_thread);
}

TEST_F(metrics_http_server_test, connection_cap_recovers) {
  std::vector<std::unique_ptr<silent_client>> hogs;
  for (std::size_t i = 0; i < http_server::max_connections + 5; ++i)
    hogs.push_back(std::make_unique<silent_client>(port_));
  hogs.clear(); // the clients close; the server frees their slots
  bool served = false;
  auto give_up = std::chrono::steady_clock::now() + deadline;
  while (!served && std::chrono::steady_clock::now() < give_up) {
    served = get(port_, "/metrics").status == 200;
    if (!served)
      std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(served);
}

TEST(metrics_http_server, callback_exception_is_500) {
  std::atomic<bool> fail{true};
  http_server server("127.0.0.1", 0, [&]() -> std::string {
    if (fail)
      throw std::runtime_error("collector broke");
    return "h2_up 1\n";
  });
  EXPECT_EQ(get(server.port(), "/metrics").status, 500);
  fail = false;
  auto r = get(server.port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "h2_up 1\n");
}

TEST(metrics_http_server, port_in_use_is_an_error) {
  http_server first("127.0.0.1", 0, [] { return std::string(); });
  try {
    http_server second("127.0.0.1", first.port(), [] { return std::string(); });
    FAIL() << "bound a port in use";
  } catch (const h2::error& e) {
    std::string expected =
      "cannot listen on 127.0.0.1:" + std::to_string(first.port()) + ": ";
    EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
  }
}

TEST(metrics_http_server, stop_is_prompt_and_idempotent) {
  auto server =
    std::make_unique<http_server>("127.0.0.1", 0, [] { return "x\n"; });
  auto port = server->port();
  ASSERT_EQ(get(port, "/metrics").status, 200);
  silent_client silent(port);
  // stop() must not wait for the silent client's deadline; the generous
  // bound here only turns a hang into a failure.
  auto stopped = std::async(std::launch::async, [&] { server->stop(); });
  ASSERT_EQ(stopped.wait_for(deadline), std::future_status::ready);
  stopped.get();
  server->stop();
  EXPECT_TRUE(silent.closed_by_server());
  // Nobody listens any more.
  asio::io_context io;
  tcp::socket s(io);
  asio::error_code ec;
  s.connect(server_endpoint(port), ec);
  EXPECT_TRUE(ec) << "connected after stop()";
  server.reset();
}

TEST(metrics_http_server, destructor_stops_while_clients_are_connected) {
  std::uint16_t port = 0;
  std::unique_ptr<silent_client> silent;
  {
    http_server server("127.0.0.1", 0, [] { return "x\n"; });
    port = server.port();
    silent = std::make_unique<silent_client>(port);
    EXPECT_EQ(get(port, "/metrics").status, 200);
  }
  EXPECT_TRUE(silent->closed_by_server());
}

} // namespace
} // namespace h2::metrics

namespace h2::metrics {
namespace {

/// A server with an echo route (POST /echo), a blocking route that waits
/// until released (POST /wait) and /metrics.
class metrics_http_routes_test : public ::testing::Test {
protected:
  void SetUp() override {
    http_route echo{"/echo", "POST", [](const http_call& c) {
                      return http_answer{200, "text/plain",
                                         c.method + " " + c.path + " " +
                                           c.body};
                    }};
    http_route wait{"/wait", "POST",
                    [this](const http_call&) {
                      std::unique_lock<std::mutex> lock(mutex_);
                      released_.wait(lock, [this] { return release_; });
                      return http_answer{200, "text/plain", "waited"};
                    },
                    true};
    http_route metrics{"/metrics", "GET", [](const http_call&) {
                         return http_answer{200, "text/plain", "m 1\n"};
                       }};
    // Answers the Authorization header it got, with a header of its own;
    // /split answers one that would split the response.
    http_route who{"/who", "GET", [](const http_call& c) {
                     http_answer a{200, "text/plain", c.authorization};
                     a.headers = {{"X-Who", "h2"}};
                     return a;
                   }};
    http_route split{"/split", "GET", [](const http_call&) {
                       http_answer a{200, "text/plain", "x"};
                       a.headers = {{"X-Bad", "a\r\nSet-Cookie: b"}};
                       return a;
                     }};
    server_ = std::make_unique<http_server>(
      "127.0.0.1", 0, std::vector<http_route>{echo, wait, metrics, who, split});
  }
  void TearDown() override {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      release_ = true;
    }
    released_.notify_all();
  }

  std::unique_ptr<http_server> server_;
  std::mutex mutex_;
  std::condition_variable released_;
  bool release_ = false;
};

TEST_F(metrics_http_routes_test, a_post_body_reaches_its_route_whole) {
  const std::string body(300000, 'b'); // beyond what comes with the head
  auto r = send_request(server_->port(),
                        "POST /echo HTTP/1.1\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(r.status, 200) << r.raw.substr(0, 200);
  EXPECT_EQ(r.body, "POST /echo " + body);
  auto wrong = get(server_->port(), "/echo");
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.headers["allow"], "POST");
  EXPECT_EQ(get(server_->port(), "/nothing").status, 404);
}

TEST_F(metrics_http_routes_test, a_loopback_server_answers_only_local_hosts) {
  // A name the attacker's DNS points at 127.0.0.1 (DNS rebinding) is
  // refused; literals, localhost and no Host at all are served.
  auto with_host = [&](const std::string& host) {
    return send_request(server_->port(),
                        "GET /metrics HTTP/1.1\r\n" + host + "\r\n")
      .status;
  };
  EXPECT_EQ(with_host("Host: attacker.example:9400\r\n"), 421);
  EXPECT_EQ(with_host("Host: 127.0.0.1.nip.io\r\n"), 421);
  EXPECT_EQ(with_host("Host: 127.0.0.1:9400\r\n"), 200);
  EXPECT_EQ(with_host("Host: localhost\r\n"), 200);
  EXPECT_EQ(with_host(""), 200);
}

TEST_F(metrics_http_routes_test, routes_see_authorization_and_add_headers) {
  auto r = send_request(server_->port(), "GET /who HTTP/1.1\r\nauthorization:"
                                         " Bearer abc \r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body, "Bearer abc");
  EXPECT_EQ(r.headers["x-who"], "h2");
  EXPECT_EQ(get(server_->port(), "/who").body, "");
  // Two Authorization headers are ambiguous: 400.
  EXPECT_EQ(send_request(server_->port(),
                         "GET /who HTTP/1.1\r\nAuthorization: a\r\n"
                         "Authorization: b\r\n\r\n")
              .status,
            400);
  // A header with a line break never reaches the wire: 500.
  auto split = get(server_->port(), "/split");
  EXPECT_EQ(split.status, 500) << split.raw;
  EXPECT_EQ(split.raw.find("Set-Cookie"), std::string::npos) << split.raw;
}

TEST_F(metrics_http_routes_test, a_body_over_the_limit_is_413_unread) {
  auto r = send_request(
    server_->port(), "POST /echo HTTP/1.1\r\nContent-Length: " +
                       std::to_string(http_server::max_request_body_bytes + 1) +
                       "\r\n\r\nxyz");
  EXPECT_EQ(r.status, 413) << r.raw;
}

TEST_F(metrics_http_routes_test, only_post_routes_read_a_body) {
  // A GET that promises a body is answered without waiting for it.
  auto r = send_request(server_->port(),
                        "GET /metrics HTTP/1.1\r\nContent-Length: 1000000"
                        "\r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body, "m 1\n");
}

TEST_F(metrics_http_routes_test, a_blocking_route_holds_up_no_other) {
  reply waited;
  std::thread waiting([&] {
    waited = send_request(server_->port(),
                          "POST /wait HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  });
  // While /wait waits on the worker, the I/O thread answers the others.
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(get(server_->port(), "/metrics").body, "m 1\n");
  {
    std::lock_guard<std::mutex> guard(mutex_);
    release_ = true;
  }
  released_.notify_all();
  waiting.join();
  EXPECT_EQ(waited.status, 200);
  EXPECT_EQ(waited.body, "waited");
}

} // namespace
} // namespace h2::metrics
