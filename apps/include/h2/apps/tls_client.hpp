// h2-admin's side of an admin endpoint that speaks TLS (docs/admin.md,
// "TLS"): OpenSSL over a connected non-blocking socket, every call bounded
// by a deadline.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

typedef struct ssl_st SSL;         // NOLINT: OpenSSL's own names
typedef struct ssl_ctx_st SSL_CTX; // NOLINT

namespace h2::apps {

/// PEM files.
struct tls_client_options {
  std::string ca; ///< the CA that signed the endpoint's certificate
  /// The client's certificate and key, for an endpoint that admits only
  /// clients of its CA ("": none).
  std::string certificate;
  std::string key;
};

/// The files of `options`, loaded once before anything is sent: TLS 1.2
/// or later, the endpoint's certificate checked against options.ca.
/// Throws config_error naming --ca, --cert or --key when a file does not
/// load (an encrypted key included: nothing asks for a passphrase).
class tls_client_context {
public:
  explicit tls_client_context(const tls_client_options& options);

  SSL_CTX* get() const noexcept { return ctx_.get(); }

private:
  std::shared_ptr<SSL_CTX> ctx_;
};

/// A TLS session with the endpoint at `host` over `fd` (connected,
/// non-blocking; the caller keeps and closes it). The endpoint's
/// certificate must chain to the context's CA and name `host` (a DNS name
/// or an IP address in its subjectAltName). Every call throws h2::error
/// naming what failed (the handshake, the certificate's verification, the
/// deadline).
class tls_client {
public:
  using time_point = std::chrono::steady_clock::time_point;

  tls_client(int fd, const std::string& host, const tls_client_context& ctx,
             time_point until);
  ~tls_client();
  tls_client(const tls_client&) = delete;
  tls_client& operator=(const tls_client&) = delete;

  /// Sends all of `data`.
  void write_all(std::string_view data, time_point until);

  /// Reads what has come, up to `n` bytes; 0 once the endpoint ended the
  /// stream.
  std::size_t read_some(char* out, std::size_t n, time_point until);

private:
  /// Runs `op` (an SSL_* call) until it succeeds or fails for good, waiting
  /// on the socket in between; returns its result (> 0, or 0 with the
  /// session ended cleanly).
  template <class F>
  int retry(F op, const char* what, time_point until);

  int fd_;
  std::string host_;
  SSL* ssl_ = nullptr;
};

} // namespace h2::apps
