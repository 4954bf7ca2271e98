#include "h2/apps/tls_client.hpp"

#include "h2/core/error.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

namespace h2::apps {

namespace {

/// OpenSSL's queued errors, as one line (and the queue emptied).
std::string openssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out;
}

int millis_until(tls_client::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
    until - std::chrono::steady_clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

bool is_ip_address(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

/// Refuses to ask for a passphrase: an encrypted key does not load.
int no_passphrase(char*, int, int, void*) {
  return 0;
}

} // namespace

tls_client_context::tls_client_context(const tls_client_options& options) {
  ERR_clear_error();
  ctx_.reset(SSL_CTX_new(TLS_client_method()), &SSL_CTX_free);
  if (!ctx_)
    throw error("TLS: " + openssl_errors());
  auto* ctx = ctx_.get();
  auto refuse = [](const char* flag, const std::string& path) {
    const auto why = openssl_errors();
    throw config_error(flag, "cannot use \"" + path + "\"" +
                               (why.empty() ? "" : ": " + why));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_default_passwd_cb(ctx, &no_passphrase);
  if (SSL_CTX_load_verify_locations(ctx, options.ca.c_str(), nullptr) != 1)
    refuse("--ca", options.ca);
  if (options.certificate.empty())
    return;
  if (SSL_CTX_use_certificate_chain_file(ctx, options.certificate.c_str()) !=
      1)
    refuse("--cert", options.certificate);
  if (SSL_CTX_use_PrivateKey_file(ctx, options.key.c_str(),
                                  SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1)
    refuse("--key", options.key);
}

tls_client::tls_client(int fd, const std::string& host,
                       const tls_client_context& ctx, time_point until)
    : fd_(fd), host_(host) {
  // The handshake's small records go out at once: with Nagle's algorithm
  // each would wait for the peer's delayed ACK (about 40 ms a request).
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ERR_clear_error();
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx.get()),
                                                &SSL_free);
  if (!ssl || SSL_set_fd(ssl.get(), fd) != 1)
    throw error("TLS: cannot start a session: " + openssl_errors());
  // The endpoint's certificate must name the host it was reached at.
  if (is_ip_address(host)
        ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl.get()),
                                        host.c_str()) != 1
        : SSL_set1_host(ssl.get(), host.c_str()) != 1 ||
            SSL_set_tlsext_host_name(ssl.get(), host.c_str()) != 1)
    throw error("TLS: cannot check the endpoint's name " + host + ": " +
                openssl_errors());
  ssl_ = ssl.get();
  try {
    if (retry([&] { return SSL_connect(ssl_); }, "the handshake", until) <= 0)
      throw error("TLS: the handshake with " + host + " ended early");
  } catch (const error&) {
    const long verified = SSL_get_verify_result(ssl_);
    ssl_ = nullptr;
    if (verified == X509_V_ERR_HOSTNAME_MISMATCH ||
        verified == X509_V_ERR_IP_ADDRESS_MISMATCH)
      throw error("TLS: the endpoint's certificate does not name " + host);
    if (verified != X509_V_OK)
      throw error(std::string("TLS: the endpoint's certificate is not "
                              "trusted (--ca): ") +
                  X509_verify_cert_error_string(verified));
    throw;
  }
  ssl.release();
}

tls_client::~tls_client() {
  SSL_free(ssl_);
}

template <class F>
int tls_client::retry(F op, const char* what, time_point until) {
  for (;;) {
    ERR_clear_error();
    errno = 0;
    const int r = op();
    if (r > 0)
      return r;
    short events = 0;
    switch (SSL_get_error(ssl_, r)) {
      case SSL_ERROR_WANT_READ:
        events = POLLIN;
        break;
      case SSL_ERROR_WANT_WRITE:
        events = POLLOUT;
        break;
      case SSL_ERROR_ZERO_RETURN:
        return 0; // the endpoint ended the session
      case SSL_ERROR_SYSCALL: {
        const int e = errno;
        const auto detail = openssl_errors();
        throw error(std::string("TLS: ") + what + " with " + host_ +
                    " failed: " +
                    (!detail.empty() ? detail
                     : e != 0        ? std::string(std::strerror(e))
                                     : "the connection ended"));
      }
      default: {
        const auto detail = openssl_errors();
        throw error(std::string("TLS: ") + what + " with " + host_ +
                    " failed: " + (detail.empty() ? "no detail" : detail));
      }
    }
    pollfd p{fd_, events, 0};
    int ready;
    while ((ready = ::poll(&p, 1, millis_until(until))) < 0 && errno == EINTR) {
    }
    if (ready != 1)
      throw error(std::string("TLS: ") + what + " with " + host_ +
                  " timed out");
  }
}

void tls_client::write_all(std::string_view data, time_point until) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const int n = retry(
      [&] {
        return SSL_write(ssl_, data.data() + sent,
                         static_cast<int>(data.size() - sent));
      },
      "sending", until);
    if (n <= 0)
      throw error("TLS: " + host_ + " closed the session");
    sent += static_cast<std::size_t>(n);
  }
}

std::size_t tls_client::read_some(char* out, std::size_t n, time_point until) {
  const int r = retry(
    [&] { return SSL_read(ssl_, out, static_cast<int>(n)); }, "reading", until);
  return r > 0 ? static_cast<std::size_t>(r) : 0;
}

} // namespace h2::apps
