#include "caf_port.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/job_credentials.hpp"

#include <caf/actor_cast.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/io/scribe.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/session.hpp>
#include <caf/io/broker.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

namespace h2::actors {

namespace {

/// An anonymous memory file holding `text`, for CAF to open by path.
int memory_file(const char* name, const std::string& text) {
  const int fd = ::memfd_create(name, MFD_CLOEXEC);
  if (fd < 0)
    throw error(std::string("cannot create a memory file for the job's TLS "
                            "identity: ") +
                std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const auto n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) {
      ::close(fd);
      throw error("cannot write the job's TLS identity to a memory file");
    }
    done += static_cast<std::size_t>(n);
  }
  return fd;
}

std::string path_of(int fd) {
  return "/proc/self/fd/" + std::to_string(fd);
}

} // namespace

caf_tls::caf_tls(const job_config& job, const transport::job_secret& secret) {
  const auto& security = job.security;
  if (!security.certificate.empty()) {
    for (const auto& [key, path] :
         {std::pair<const char*, const std::string*>{"security.certificate",
                                                     &security.certificate},
          {"security.key", &security.key},
          {"security.ca_file", &security.ca_file}})
      if (::access(path->c_str(), R_OK) != 0)
        throw config_error(key, "cannot read \"" + *path + "\"");
    certificate_ = security.certificate;
    key_ = security.key;
    ca_file_ = security.ca_file;
    return;
  }
  const auto derived = transport::derive_tls_credentials(secret);
  certificate_fd_ = memory_file("h2-tls-certificate", derived.certificate_pem);
  try {
    key_fd_ = memory_file("h2-tls-key", derived.key_pem);
  } catch (...) {
    ::close(certificate_fd_);
    throw;
  }
  certificate_ = path_of(certificate_fd_);
  key_ = path_of(key_fd_);
  ca_file_ = certificate_; // the one certificate every node shares
}

caf_tls::~caf_tls() {
  for (int fd : {certificate_fd_, key_fd_})
    if (fd >= 0)
      ::close(fd);
}

void caf_tls::configure(caf::actor_system_config& cfg) const {
  cfg.openssl_certificate = certificate_;
  cfg.openssl_key = key_;
  cfg.openssl_cafile = ca_file_;
  cfg.load<caf::openssl::manager>();
}

std::string caf_tls::describe() const {
  if (certificate_fd_ >= 0)
    return "the job's TLS identity, derived from its secret";
  return "peers' certificates checked against " + ca_file_;
}

namespace {

/// A TCP connection to host:port with send and receive timeouts; -1 when
/// it cannot be made.
int dial(const std::string& host, std::uint16_t port,
         std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints,
                    &found) != 0)
    return -1;
  int fd = -1;
  for (auto* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC,
                  a->ai_protocol);
    if (fd < 0)
      continue;
    timeval tv{};
    tv.tv_sec = timeout.count() / 1000;
    tv.tv_usec = (timeout.count() % 1000) * 1000;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  return fd;
}

/// OpenSSL's queued errors as one line ("" when none).
std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ::ERR_get_error()) {
    char text[256];
    ::ERR_error_string_n(e, text, sizeof(text));
    out += (out.empty() ? "" : "; ") + std::string(text);
  }
  return out;
}

} // namespace

caf_tls::probe_result caf_tls::probe(const std::string& host,
                                     std::uint16_t port,
                                     std::chrono::milliseconds timeout,
                                     std::string& why) const {
  const int fd = dial(host, port, timeout);
  if (fd < 0)
    return probe_result::unreachable;
  std::unique_ptr<SSL_CTX, decltype(&::SSL_CTX_free)> ctx(
    ::SSL_CTX_new(::TLS_client_method()), &::SSL_CTX_free);
  std::unique_ptr<SSL, decltype(&::SSL_free)> ssl(nullptr, &::SSL_free);
  probe_result result = probe_result::refused;
  ::ERR_clear_error();
  if (ctx &&
      ::SSL_CTX_use_certificate_chain_file(ctx.get(), certificate_.c_str()) ==
        1 &&
      ::SSL_CTX_use_PrivateKey_file(ctx.get(), key_.c_str(),
                                    SSL_FILETYPE_PEM) == 1 &&
      ::SSL_CTX_load_verify_locations(ctx.get(), ca_file_.c_str(), nullptr) ==
        1) {
    ::SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
    ssl.reset(::SSL_new(ctx.get()));
  }
  if (ssl && ::SSL_set_fd(ssl.get(), fd) == 1 &&
      ::SSL_connect(ssl.get()) == 1) {
    // TLS 1.3 refuses a client's certificate after the client finished:
    // the first read shows it. A peer that accepted speaks first (CAF's
    // handshake) or, slow, says nothing within the timeout.
    char byte = 0;
    const int n = ::SSL_read(ssl.get(), &byte, 1);
    const int code = n > 0 ? SSL_ERROR_NONE : ::SSL_get_error(ssl.get(), n);
    if (n > 0 || (code == SSL_ERROR_SYSCALL && (errno == EAGAIN ||
                                                errno == EWOULDBLOCK)))
      result = probe_result::accepted;
  }
  if (result == probe_result::refused)
    why = openssl_errors();
  if (why.empty())
    why = "the peer ended the handshake";
  ssl.reset();
  ::close(fd);
  return result;
}

// -- the guarded port --------------------------------------------------------

namespace {

using caf::io::network::native_socket;
using caf::io::network::rw_state;
using clock = std::chrono::steady_clock;

/// One accepted connection, as its doorman sees it. Touched only on the
/// multiplexer's thread, where CAF 0.17 runs doormen, scribes and the BASP
/// broker; atomics all the same, since a scribe's last reference may drop
/// elsewhere.
struct port_connection {
  native_socket fd;
  clock::time_point accepted;
  std::atomic<bool> proven{false}; ///< its TLS handshake ended: it has data
  std::atomic<bool> gone{false};   ///< its scribe (and descriptor) is gone
  bool cut = false;                ///< shut down by the doorman
};

/// A stream's reads and writes through its TLS session; the first bytes
/// read mark the connection proven (TLS hands out no byte before the
/// handshake, with the peer's certificate checked, has ended).
class tls_policy {
public:
  tls_policy(caf::openssl::session_ptr session,
             std::shared_ptr<port_connection> conn)
      : session_(std::move(session)), conn_(std::move(conn)) {}

  rw_state read_some(std::size_t& result, native_socket fd, void* buf,
                     std::size_t len) {
    const auto state = session_->read_some(result, fd, buf, len);
    if (state == rw_state::success && result > 0)
      conn_->proven.store(true);
    return state;
  }

  rw_state write_some(std::size_t& result, native_socket fd, const void* buf,
                      std::size_t len) {
    return session_->write_some(result, fd, buf, len);
  }

  bool must_read_more(native_socket fd, std::size_t threshold) {
    return session_->must_read_more(fd, threshold);
  }

private:
  caf::openssl::session_ptr session_;
  std::shared_ptr<port_connection> conn_;
};

/// A scribe over tls_policy (the shape of CAF's own TCP scribe).
class tls_scribe final : public caf::io::scribe {
public:
  tls_scribe(caf::io::network::default_multiplexer& mpx, native_socket fd,
             caf::openssl::session_ptr session,
             std::shared_ptr<port_connection> conn)
      : caf::io::scribe(caf::io::network::conn_hdl_from_socket(fd)),
        conn_(conn), stream_(mpx, fd, std::move(session), std::move(conn)) {}

  ~tls_scribe() override { conn_->gone.store(true); }

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) {
      launched_ = true;
      stream_.start(this);
      // Drives the TLS handshake before BASP has anything to write.
      stream_.force_empty_write(this);
    }
  }

  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }

  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }

  void flush() override { stream_.flush(this); }

  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string{};
  }

  std::uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }

  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

private:
  std::shared_ptr<port_connection> conn_;
  bool launched_ = false;
  caf::io::network::stream_impl<tls_policy> stream_;
};

/// The connections of a guarded port still in their TLS handshake, oldest
/// first. Touched only on the multiplexer's thread (the doorman, and the
/// sweeps guarded_port posts there).
class pending_connections {
public:
  explicit pending_connections(caf_port_limits limits) : limits_(limits) {}

  /// A new connection: cuts off expired handshakes, and the oldest one when
  /// every slot is taken, then tracks it (cut at once once the port closes).
  std::shared_ptr<port_connection> admit(native_socket fd) {
    sweep();
    if (pending_.size() >= std::max<std::size_t>(limits_.max_pending, 1)) {
      cut(*pending_.front());
      pending_.pop_front();
    }
    auto conn = std::make_shared<port_connection>();
    conn->fd = fd;
    conn->accepted = clock::now();
    if (closed_)
      cut(*conn);
    else
      pending_.push_back(conn);
    return conn;
  }

  /// Cuts off the handshakes past the timeout; forgets the connections
  /// that proved themselves or are gone.
  void sweep() {
    const auto now = clock::now();
    for (auto& c : pending_)
      if (!c->proven.load() && !c->gone.load() &&
          now - c->accepted >= limits_.handshake_timeout)
        cut(*c);
    forget_settled();
  }

  /// The port closes: cuts off every handshake in progress (CAF 0.17 ends
  /// a connection by waiting for its peer's FIN, which a silent peer never
  /// sends, so its actor system could never stop) and every later one.
  void cut_all() {
    closed_ = true;
    for (auto& c : pending_)
      if (!c->proven.load() && !c->gone.load())
        cut(*c);
    forget_settled();
  }

private:
  void forget_settled() {
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const auto& c) {
                                    return c->cut || c->proven.load() ||
                                           c->gone.load();
                                  }),
                   pending_.end());
  }

  /// Ends a connection's handshake: its scribe reads the end of the stream
  /// and CAF closes it as any other.
  static void cut(port_connection& c) {
    c.cut = true;
    ::shutdown(c.fd, SHUT_RDWR);
  }

  caf_port_limits limits_;
  bool closed_ = false;
  std::deque<std::shared_ptr<port_connection>> pending_;
};

/// Accepts connections over TLS, each admitted by the port's
/// pending_connections (docs/transport.md, "TLS"). A node that knows the
/// secret proves it within a round trip, so only silent or failing peers
/// are ever cut off.
class guarded_doorman final : public caf::io::network::doorman_impl {
public:
  guarded_doorman(caf::io::network::default_multiplexer& mpx,
                  native_socket fd, std::shared_ptr<pending_connections> p)
      : caf::io::network::doorman_impl(mpx, fd), pending_(std::move(p)) {}

  bool new_connection() override {
    if (detached())
      return false;
    auto& mpx = acceptor_.backend();
    const native_socket fd = acceptor_.accepted_socket();
    caf::io::network::nonblocking(fd, true);
    auto conn = pending_->admit(fd);
    auto session = caf::openssl::make_session(parent()->system(), fd, true);
    if (!session) { // this one failed its first handshake step
      conn->gone.store(true);
      ::close(fd);
      return false;
    }
    auto scribe = caf::make_counted<tls_scribe>(mpx, fd, std::move(session),
                                                std::move(conn));
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return doorman::new_connection(&mpx, hdl);
  }

private:
  std::shared_ptr<pending_connections> pending_;
};

/// The middleman actor's publishing with guarded_doorman.
class guarded_middleman final : public caf::io::middleman_actor_impl {
public:
  guarded_middleman(caf::actor_config& cfg, caf::actor broker,
                    std::shared_ptr<pending_connections> pending)
      : caf::io::middleman_actor_impl(cfg, std::move(broker)),
        pending_(std::move(pending)) {}

  const char* name() const override { return "h2.guarded_middleman"; }

protected:
  caf::expected<caf::io::doorman_ptr> open(std::uint16_t port,
                                           const char* addr,
                                           bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd)
      return std::move(fd.error());
    auto& mpx = static_cast<caf::io::network::default_multiplexer&>(
      system().middleman().backend());
    return caf::make_counted<guarded_doorman>(mpx, *fd, pending_);
  }

private:
  std::shared_ptr<pending_connections> pending_;
};

using sweep_atom = caf::atom_constant<caf::atom("sweep")>;
using cut_atom = caf::atom_constant<caf::atom("cut")>;

/// Keeps the port's handshakes in bounds on the multiplexer's thread (a
/// broker runs there): sweeps them once a second, and cuts them all off
/// when the port closes, then quits.
caf::behavior port_keeper(caf::io::broker* self,
                          std::shared_ptr<pending_connections> pending) {
  self->delayed_send(self, std::chrono::seconds(1), sweep_atom::value);
  return {
    [self, pending](sweep_atom) {
      pending->sweep();
      self->delayed_send(self, std::chrono::seconds(1), sweep_atom::value);
    },
    [self, pending](cut_atom) {
      pending->cut_all();
      self->quit();
      return true;
    },
  };
}

} // namespace

guarded_port::~guarded_port() {
  if (!middleman_)
    return;
  caf::scoped_actor self{middleman_.home_system()};
  // Bounded: the keeper answers from the multiplexer's next turn.
  self->request(keeper_, std::chrono::seconds(10), cut_atom::value)
    .receive([](bool) {}, [](const caf::error&) {});
  self->send_exit(middleman_, caf::exit_reason::user_shutdown);
}

guarded_port publish_guarded(caf::actor_system& system,
                             const caf::actor& whom, std::uint16_t port,
                             const std::string& host, caf_port_limits limits) {
  auto broker = system.middleman().named_broker<caf::io::basp_broker>(
    caf::atom("BASP"));
  auto pending = std::make_shared<pending_connections>(limits);
  auto middleman =
    system.spawn<guarded_middleman, caf::hidden>(std::move(broker), pending);
  caf::scoped_actor self{system};
  std::uint16_t actual = 0;
  caf::error failed;
  self
    ->request(middleman, caf::infinite, caf::publish_atom::value, port,
              caf::actor_cast<caf::strong_actor_ptr>(whom),
              system.message_types(whom), host, true)
    .receive([&](std::uint16_t p) { actual = p; },
             [&](caf::error& e) { failed = std::move(e); });
  if (failed) {
    caf::anon_send_exit(middleman, caf::exit_reason::user_shutdown);
    throw error(system.render(failed));
  }
  return guarded_port(caf::actor_cast<caf::actor>(middleman),
                      system.middleman().spawn_broker(port_keeper, pending),
                      actual);
}

} // namespace h2::actors
