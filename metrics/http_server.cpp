#include "h2/metrics/http_server.hpp"

#include "h2/core/error.hpp"
#include "h2/metrics/http_request.hpp"

#include <asio.hpp>
#include <asio/ssl.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>

namespace h2::metrics {

namespace {

using asio::ip::tcp;
using tls_stream = asio::ssl::stream<tcp::socket>;
using buffer_iterator =
  asio::buffers_iterator<asio::streambuf::const_buffers_type>;

/// After a response the server reads and discards what the client still
/// sends, up to this much, before closing: closing a socket with unread input
/// resets the connection, and the client could lose the response.
constexpr std::size_t max_drain_bytes = std::size_t{64} * 1024;
constexpr std::chrono::seconds drain_timeout{2};
/// Pause before accepting again after accept() failed (e.g. out of file
/// descriptors), so that the server does not spin.
constexpr std::chrono::milliseconds accept_retry_delay{100};

constexpr std::string_view exposition_content_type =
  "text/plain; version=0.0.4; charset=utf-8";
constexpr std::string_view index_html =
  "<!DOCTYPE html>\n<html><head><title>H2</title></head>\n"
  "<body><h1>H2</h1><p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

/// Match condition for async_read_until: the end of a request head.
std::pair<buffer_iterator, bool> match_head_end(buffer_iterator begin,
                                                buffer_iterator end) {
  return find_request_head_end(begin, end);
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 421:
      return "Misdirected Request";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

struct response {
  http_answer answer;
  std::string allow; ///< "Allow:" of a 405
};

response error_response(int status, std::string allow = "") {
  response r;
  r.answer.status = status;
  r.answer.content_type = "text/plain; charset=utf-8";
  r.answer.body = std::string(reason_phrase(status)) + "\n";
  r.allow = std::move(allow);
  return r;
}

/// The route for `req`, or the error response when there is none.
std::variant<const http_route*, response>
find_route(const http_request& req, const std::vector<http_route>& routes) {
  if (req.error_status != 0)
    return error_response(req.error_status);
  std::string allow;
  for (const auto& r : routes) {
    if (r.path != req.path)
      continue;
    if (r.method == req.method || (r.method == "GET" && req.method == "HEAD"))
      return &r;
    allow += (allow.empty() ? "" : ", ") + r.method +
             (r.method == "GET" ? ", HEAD" : "");
  }
  if (allow.empty())
    return error_response(404);
  return error_response(405, allow);
}

/// What `route` answers `call`; a handler that throws, or answers a header
/// that would split the response, is a 500.
response answer_of(const http_route& route, const http_call& call) {
  try {
    auto answer = route.handler(call);
    for (const auto& [name, value] : answer.headers)
      H2_ENFORCE(name.find_first_of("\r\n:") == name.npos &&
                   value.find_first_of("\r\n") == value.npos,
                 "a response header with a line break: ", name);
    return {std::move(answer), ""};
  } catch (const std::exception& e) {
    std::fprintf(stderr, "h2 http server: %s %s failed: %s\n",
                 call.method.c_str(), call.path.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "h2 http server: %s %s failed\n", call.method.c_str(),
                 call.path.c_str());
  }
  return error_response(500);
}

/// The routes of a metrics server: the exposition and an index page.
std::vector<http_route> metrics_routes(std::function<std::string()> body) {
  return {prometheus_route(std::move(body)), index_route()};
}

} // namespace

http_route prometheus_route(std::function<std::string()> body) {
  H2_ENFORCE(body != nullptr, "http_server needs a body callback");
  return {
    "/metrics", "GET", [body = std::move(body)](const http_call&) {
      return http_answer{200, std::string(exposition_content_type), body()};
    }};
}

http_route index_route() {
  return {"/", "GET", [](const http_call&) {
            return http_answer{200, "text/html; charset=utf-8",
                               std::string(index_html)};
          }};
}

namespace {

std::string serialize(const response& r, bool head_only) {
  const auto& a = r.answer;
  std::string out = "HTTP/1.1 " + std::to_string(a.status) + " ";
  out += reason_phrase(a.status);
  out += "\r\nContent-Type: ";
  out += a.content_type;
  out += "\r\nContent-Length: " + std::to_string(a.body.size());
  out += "\r\nConnection: close\r\n";
  for (const auto& [name, value] : a.headers) // checked by answer_of
    out += name + ": " + value + "\r\n";
  if (!r.allow.empty())
    out += "Allow: " + r.allow + "\r\n";
  out += "\r\n";
  if (!head_only)
    out += a.body;
  return out;
}

/// What the server keeps of a connection, whatever its stream.
class connection_base {
public:
  virtual ~connection_base() = default;
  /// Closes the socket and the timer only (stop() clears the set itself).
  virtual void close_socket() = 0;
};

/// The server's TLS context from `tls`; throws h2::error naming the file
/// that does not load.
std::unique_ptr<asio::ssl::context> make_tls_context(const http_tls& tls) {
  std::unique_ptr<asio::ssl::context> ctx;
  try {
    ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    ctx->set_options(
      asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
      asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
      asio::ssl::context::no_tlsv1_1);
    // An encrypted key fails to load rather than asking for a passphrase;
    // clients may not renegotiate.
    ctx->set_password_callback(
      [](std::size_t, asio::ssl::context::password_purpose) {
        return std::string();
      });
    SSL_CTX_set_options(ctx->native_handle(), SSL_OP_NO_RENEGOTIATION);
  } catch (const std::exception& e) {
    throw error(std::string("TLS: ") + e.what());
  }
  auto load = [](const std::string& what, const std::string& path, auto f) {
    try {
      f();
    } catch (const std::exception& e) {
      throw error("TLS: cannot use " + what + " \"" + path + "\": " + e.what());
    }
  };
  load("the certificate", tls.certificate,
       [&] { ctx->use_certificate_chain_file(tls.certificate); });
  load("the private key", tls.key,
       [&] { ctx->use_private_key_file(tls.key, asio::ssl::context::pem); });
  if (!tls.client_ca.empty()) {
    load("the client CA", tls.client_ca, [&] {
      ctx->load_verify_file(tls.client_ca);
      // Named in the certificate request, so a client picks its right one.
      if (auto* names = SSL_load_client_CA_file(tls.client_ca.c_str()))
        SSL_CTX_set_client_CA_list(ctx->native_handle(), names);
    });
    ctx->set_verify_mode(asio::ssl::verify_peer |
                         asio::ssl::verify_fail_if_no_peer_cert);
    // Verified clients may resume TLS 1.2 sessions.
    static const unsigned char context_id[] = "h2-http-server";
    SSL_CTX_set_session_id_context(ctx->native_handle(), context_id,
                                   sizeof(context_id) - 1);
  }
  return ctx;
}

/// The state the server thread works on. Touched only by the server thread
/// while it runs, and by stop() after joining it.
struct server_core {
  /// Set: every connection speaks TLS. Declared before `io` so that it
  /// outlives the streams that handlers queued in `io` still hold.
  std::unique_ptr<asio::ssl::context> tls;
  // Declared before the sockets and timers, so that it is destroyed after
  // them: they must not outlive their io_context.
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::vector<http_route> routes;
  /// Bound to a loopback address: Host must name this machine by a
  /// literal (host_is_local_literal), or be absent.
  bool loopback = false;
  std::set<std::shared_ptr<connection_base>> connections;
  /// Where blocking routes run, one call at a time.
  asio::io_context worker;
  asio::executor_work_guard<asio::io_context::executor_type> worker_guard =
    asio::make_work_guard(worker);

  /// Whether an accept is pending (none at the connection cap).
  bool accepting = true;

  void accept();
  /// Accepts again once a slot is free.
  void resume_accepting();
  void shutdown();
};

/// One client: (with TLS, a handshake,) read the head (bounded in size and
/// time), answer, drain, close. Kept alive by the server's set and by its
/// pending handlers. `Stream`: tcp::socket, or tls_stream.
template <class Stream>
class connection : public connection_base,
                   public std::enable_shared_from_this<connection<Stream>> {
  static constexpr bool tls = std::is_same_v<Stream, tls_stream>;

public:
  connection(server_core& server, Stream stream)
      : server_(server),
        socket_(std::move(stream)),
        deadline_(server.io),
        buffer_(http_server::max_request_head_bytes) {}

  void start() {
    arm(http_server::request_timeout); // the handshake included
    if constexpr (tls)
      socket_.async_handshake(
        asio::ssl::stream_base::server,
        [self = this->shared_from_this()](const asio::error_code& ec) {
          if (self->closed_)
            return;
          if (ec) // not TLS, or a client certificate the CA did not sign
            self->close();
          else
            self->read_head();
        });
    else
      read_head();
  }

  /// Closes the socket and forgets the connection; its pending operations
  /// then complete with errors and release it.
  void close() {
    if (closed_)
      return;
    close_socket();
    server_.connections.erase(this->shared_from_this());
    server_.resume_accepting();
  }

  void close_socket() override {
    closed_ = true;
    gone_ = true;
    asio::error_code ignored;
    socket_.lowest_layer().close(ignored);
    deadline_.cancel();
  }

private:
  void read_head() {
    asio::async_read_until(
      socket_, buffer_, &match_head_end,
      [self = this->shared_from_this()](
        const asio::error_code& ec, std::size_t n) { self->on_head(ec, n); });
  }

  /// (Re)starts the deadline; when it passes, the connection is closed.
  void arm(std::chrono::steady_clock::duration timeout) {
    deadline_.expires_after(timeout);
    deadline_.async_wait(
      [self = this->shared_from_this()](const asio::error_code& ec) {
        // A re-armed deadline cancels this wait; check the expiry as well in
        // case it passed just before being re-armed.
        if (!ec && self->deadline_.expiry() <= std::chrono::steady_clock::now())
          self->close();
      });
  }

  void on_head(const asio::error_code& ec, std::size_t n) {
    if (closed_)
      return;
    if (ec == asio::error::not_found) {
      // The buffer filled up (max_request_head_bytes) without a blank line.
      write(serialize(error_response(431), false));
      return;
    }
    if (ec) {
      close();
      return;
    }
    auto begin = asio::buffers_begin(buffer_.data());
    std::string head(begin, begin + static_cast<std::ptrdiff_t>(n));
    const http_request req = parse_http_request(head);
    head_only_ = req.method == "HEAD";
    if (server_.loopback && !req.host.empty() &&
        !host_is_local_literal(req.host)) {
      write(serialize(error_response(421), head_only_));
      return;
    }
    auto found = find_route(req, server_.routes);
    if (auto* refused = std::get_if<response>(&found)) {
      write(serialize(*refused, head_only_));
      return;
    }
    route_ = std::get<const http_route*>(found);
    if (req.content_length > http_server::max_request_body_bytes) {
      write(serialize(error_response(413), head_only_));
      return;
    }
    call_.method = req.method == "HEAD" ? "GET" : req.method;
    call_.path = req.path;
    call_.peer = peer();
    call_.authorization = req.authorization;
    if (route_->method != "POST" || req.content_length == 0) {
      dispatch(); // only POST routes take a body; others leave it unread
      return;
    }
    // What came with the head belongs to the body; the rest is read, the
    // buffer growing as bytes come (a length promised is not allocated).
    buffer_.consume(n);
    const auto early = std::min(buffer_.size(), req.content_length);
    auto rest = asio::buffers_begin(buffer_.data());
    call_.body.assign(rest, rest + static_cast<std::ptrdiff_t>(early));
    asio::async_read(socket_,
                     asio::dynamic_buffer(call_.body, req.content_length),
                     asio::transfer_exactly(req.content_length - early),
                     [self = this->shared_from_this()](
                       const asio::error_code& e, std::size_t) {
                       if (self->closed_)
                         return;
                       if (e)
                         self->close();
                       else
                         self->dispatch();
                     });
  }

  /// Runs the route: on this thread, or on the worker for a blocking one
  /// (the answer comes back to this thread to be written).
  void dispatch() {
    if (!route_->blocking) {
      write(serialize(answer_of(*route_, call_), head_only_));
      return;
    }
    arm(http_server::response_timeout); // the handler may take a while
    asio::post(server_.worker, [self = this->shared_from_this()] {
      if (self->gone_) // closed while queued (its deadline passed): the
        return;        // client was told nothing, so nothing is done
      auto answer =
        serialize(answer_of(*self->route_, self->call_), self->head_only_);
      asio::post(self->server_.io,
                 [self, answer = std::move(answer)]() mutable {
                   if (!self->closed_)
                     self->write(std::move(answer));
                 });
    });
  }

  std::string peer() const {
    asio::error_code ec;
    const auto at = socket_.lowest_layer().remote_endpoint(ec);
    return ec ? std::string("?")
              : at.address().to_string() + ":" + std::to_string(at.port());
  }

  void write(std::string data) {
    response_ = std::move(data);
    arm(http_server::response_timeout);
    asio::async_write(
      socket_, asio::buffer(response_),
      [self = this->shared_from_this()](const asio::error_code& ec,
                                        std::size_t) { self->on_written(ec); });
  }

  void on_written(const asio::error_code& ec) {
    if (closed_)
      return;
    if (ec) {
      close();
      return;
    }
    arm(drain_timeout);
    if constexpr (tls) {
      // close_notify, then the client's (or the deadline).
      socket_.async_shutdown([self = this->shared_from_this()](
                               const asio::error_code&) { self->close(); });
    } else {
      asio::error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
      drain();
    }
  }

  void drain() {
    socket_.async_read_some(asio::buffer(discard_),
                            [self = this->shared_from_this()](
                              const asio::error_code& ec, std::size_t n) {
                              if (self->closed_)
                                return;
                              self->drained_ += n;
                              if (ec || self->drained_ > max_drain_bytes) {
                                self->close();
                                return;
                              }
                              self->drain();
                            });
  }

  server_core& server_;
  Stream socket_;
  asio::steady_timer deadline_;
  asio::streambuf buffer_;
  std::string response_;
  const http_route* route_ = nullptr;
  http_call call_;
  bool head_only_ = false;
  /// closed_, as the worker thread reads it.
  std::atomic<bool> gone_{false};
  std::array<char, 4096> discard_{};
  std::size_t drained_ = 0;
  bool closed_ = false;
};

void server_core::accept() {
  acceptor.async_accept([this](const asio::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open())
      return;
    if (ec) {
      accept_retry.expires_after(accept_retry_delay);
      accept_retry.async_wait([this](const asio::error_code& wait_ec) {
        if (!wait_ec)
          accept();
      });
      return;
    }
    // A TLS handshake and its answer are several small writes: without
    // this each waits for the client's delayed ACK (about 40 ms).
    asio::error_code no_delay_ec;
    socket.set_option(tcp::no_delay(true), no_delay_ec);
    auto serve = [this](auto stream) {
      auto c = std::make_shared<connection<decltype(stream)>>(
        *this, std::move(stream));
      connections.insert(c);
      c->start();
    };
    if (tls)
      serve(tls_stream(std::move(socket), *tls));
    else
      serve(std::move(socket));
    // At the cap, new clients wait in the listen backlog until a slot
    // frees (resume_accepting), rather than being reset.
    if (connections.size() < http_server::max_connections)
      accept();
    else
      accepting = false;
  });
}

void server_core::resume_accepting() {
  if (!accepting && acceptor.is_open() &&
      connections.size() < http_server::max_connections) {
    accepting = true;
    accept();
  }
}

void server_core::shutdown() {
  asio::error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  for (const auto& c : connections)
    c->close_socket();
  // Handlers still queued in `io` hold the connections until it is
  // destroyed; their sockets are closed already.
  connections.clear();
}

/// "host:port", with brackets around an IPv6 address.
std::string endpoint_text(const std::string& address, std::uint16_t port) {
  bool v6 = address.find(':') != std::string::npos;
  return (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
}

} // namespace

void check_tls(const http_tls& tls) {
  make_tls_context(tls);
}

struct http_server::impl {
  server_core core;
  std::thread thread;
  std::thread worker; ///< runs blocking routes
  std::mutex stop_mutex;
  bool stopped = false;
  std::uint16_t port = 0;
};

http_server::http_server(const std::string& bind_address, std::uint16_t port,
                         std::function<std::string()> metrics_body)
    : http_server(bind_address, port, metrics_routes(std::move(metrics_body))) {
}

http_server::http_server(const std::string& bind_address, std::uint16_t port,
                         std::vector<http_route> routes,
                         std::optional<http_tls> tls)
    : impl_(std::make_unique<impl>()) {
  auto& core = impl_->core;
  if (tls)
    core.tls = make_tls_context(*tls);
  for (const auto& r : routes)
    H2_ENFORCE(r.handler != nullptr && !r.path.empty() && r.path[0] == '/',
               "an http_route needs a path and a handler");
  core.routes = std::move(routes);
  auto fail = [&](const asio::error_code& ec) {
    throw error("cannot listen on " + endpoint_text(bind_address, port) + ": " +
                ec.message());
  };
  asio::error_code ec;
  tcp::endpoint endpoint;
  auto address = asio::ip::make_address(bind_address, ec);
  if (!ec) {
    endpoint = tcp::endpoint(address, port);
  } else {
    tcp::resolver resolver(core.io);
    auto results = resolver.resolve(
      bind_address, std::to_string(port),
      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec)
      fail(ec);
    if (results.empty())
      fail(asio::error::host_not_found);
    endpoint = results.begin()->endpoint();
  }
  core.loopback = endpoint.address().is_loopback();
  core.acceptor.open(endpoint.protocol(), ec);
  if (ec)
    fail(ec);
  core.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec)
    fail(ec);
  core.acceptor.bind(endpoint, ec);
  if (ec)
    fail(ec);
  core.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    fail(ec);
  impl_->port = core.acceptor.local_endpoint(ec).port();
  if (ec)
    fail(ec);
  core.accept();
  impl_->worker = std::thread([&core] { core.worker.run(); });
  impl_->thread = std::thread([&core] {
    // Handlers catch what they expect; anything else is reported and the
    // server keeps serving rather than taking the process down.
    for (;;) {
      try {
        core.io.run();
        return;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "h2 metrics server: %s\n", e.what());
      } catch (...) {
        std::fprintf(stderr, "h2 metrics server: unknown exception\n");
      }
    }
  });
}

// stop() throws only when called on the server thread (a bug) or when the
// thread cannot be joined; a destructor can recover from neither.
http_server::~http_server() { // NOLINT(bugprone-exception-escape)
  stop();
}

std::uint16_t http_server::port() const noexcept {
  return impl_->port;
}

void http_server::stop() {
  std::lock_guard lock(impl_->stop_mutex);
  if (impl_->stopped)
    return;
  H2_ENFORCE(std::this_thread::get_id() != impl_->thread.get_id(),
             "http_server::stop() called from the server thread");
  impl_->stopped = true;
  impl_->core.io.stop();
  if (impl_->thread.joinable())
    impl_->thread.join();
  // A blocking route in progress finishes; none queued starts.
  impl_->core.worker_guard.reset();
  impl_->core.worker.stop();
  if (impl_->worker.joinable())
    impl_->worker.join();
  impl_->core.shutdown();
}

} // namespace h2::metrics
