// A small HTTP/1.1 server on Asio: Prometheus scrapes (`GET /metrics`) and
// any other routes its owner gives it (the admin API, docs/admin.md).
// Treats clients as hostile (docs/architecture.md, "Trust"): bounded
// request heads and bodies, deadlines on every connection, a cap on
// concurrent connections.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace h2::metrics {

/// One request as a route sees it.
struct http_call {
  std::string method; ///< "GET", "POST" (a HEAD comes as "GET")
  std::string path;
  std::string body; ///< at most http_server::max_request_body_bytes
  std::string peer; ///< "host:port"
  std::string authorization; ///< the Authorization header ("": none)
};

/// A route's answer.
struct http_answer {
  http_answer() = default;
  http_answer(int status, std::string content_type, std::string body)
      : status(status),
        content_type(std::move(content_type)),
        body(std::move(body)) {}

  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  /// More response headers (name, value), e.g. Content-Security-Policy;
  /// neither may hold a CR or LF.
  std::vector<std::pair<std::string, std::string>> headers;
};

/// `path` answered by `handler` for `method` ("GET" answers HEAD too).
/// A `blocking` handler (one that may wait, as the admin API waits for
/// the job) runs on the server's worker thread, one call at a time; the
/// others on its I/O thread. An exception from a handler is a 500.
struct http_route {
  std::string path;
  std::string method = "GET";
  std::function<http_answer(const http_call&)> handler;
  bool blocking = false;
};

/// TLS for every connection of a server (docs/admin.md, "TLS"): PEM
/// files. With `client_ca`, a client must present a certificate that CA
/// signed, or its handshake fails.
struct http_tls {
  std::string certificate; ///< the server's certificate chain
  std::string key;         ///< its private key
  std::string client_ca;   ///< "" : any client (no client certificate)
};

/// `GET /metrics`: 200, the body from `body` (called for every scrape),
/// `Content-Type: text/plain; version=0.0.4; charset=utf-8`.
http_route prometheus_route(std::function<std::string()> body);

/// `GET /`: 200, a small HTML page linking to /metrics.
http_route index_route();

/// Loads `tls` as a server would; throws h2::error naming the file that
/// does not load (a missing file, not PEM, a key that is not the
/// certificate's).
void check_tls(const http_tls& tls);

/// Serves its routes; the metrics constructor's are:
/// - `GET /metrics`: 200, the body from the callback, `Content-Type:
///   text/plain; version=0.0.4; charset=utf-8`;
/// - `GET /`: 200, a small HTML page linking to /metrics.
/// Other paths: 404; a method a path has no route for: 405 (HEAD answers
/// as GET without the body); a malformed request: 400; a request head over
/// 8 KiB: 431; a body over 1 MiB (Content-Length): 413. Bound to a loopback
/// address, a request whose Host is not an IP literal or "localhost" is
/// 421 (host_is_local_literal: no DNS rebinding).
/// Every response carries `Content-Length` and `Connection: close`. A client
/// that has not sent a whole request head within 5 s is dropped; one that
/// does not read its response within 30 s too. At most 64 connections are
/// open at once; more wait in the listen backlog until one closes. Only
/// POST routes read a body.
class http_server {
public:
  /// Bytes a request head (request line and headers) may take.
  static constexpr std::size_t max_request_head_bytes = std::size_t{8} * 1024;
  /// Time a client has to send its request head.
  static constexpr std::chrono::seconds request_timeout{5};
  /// Time a client has to read its response.
  static constexpr std::chrono::seconds response_timeout{30};
  /// Connections served at once.
  static constexpr std::size_t max_connections = 64;
  /// Bytes a request body may take (a plan for many chips fits).
  static constexpr std::size_t max_request_body_bytes = std::size_t{1} << 20;

  /// Binds `bind_address` (an IP literal or a host name that resolves) on
  /// `port` (0: an ephemeral port, see port()) and starts serving on a
  /// thread of its own. `metrics_body` is called on that thread for every
  /// GET or HEAD /metrics; an exception from it becomes a 500 response.
  /// Throws h2::error("cannot listen on 127.0.0.1:9400: <reason>") when the
  /// address cannot be resolved or bound.
  http_server(const std::string& bind_address, std::uint16_t port,
              std::function<std::string()> metrics_body);

  /// Serves `routes` (each path and method once) as above; with `tls`,
  /// over TLS 1.2 or later only (a client that does not complete the
  /// handshake within the request deadline is dropped). Throws h2::error
  /// naming the file when a TLS file does not load.
  http_server(const std::string& bind_address, std::uint16_t port,
              std::vector<http_route> routes,
              std::optional<http_tls> tls = std::nullopt);

  /// Stops (see stop()). Destroying the server from its own callback is a
  /// bug that terminates the process.
  ~http_server(); // NOLINT(bugprone-exception-escape)

  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// The bound port (the one chosen by the system when constructed with 0).
  std::uint16_t port() const noexcept;

  /// Stops listening, closes every connection and joins the server thread;
  /// returns once the callback is no longer running. Idempotent and safe
  /// from any thread except the server thread itself (from the callback:
  /// H2_ENFORCE).
  void stop();

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace h2::metrics
