// The TLS identity every node of a job derives from the job's secret
// (docs/transport.md, "TLS"): the nodes' actor systems talk mutual TLS with
// it by default, so nothing but the secret has to reach a node, and a peer
// without the secret fails the TLS handshake before any byte reaches CAF.
#pragma once

#include "h2/transport/handshake.hpp"

#include <string>

namespace h2::transport {

/// A certificate and its private key, PEM.
struct tls_credentials {
  std::string certificate_pem;
  std::string key_pem;
};

/// The job's TLS identity: an Ed25519 key whose 32 seed bytes are the HMAC
/// of "tls/ed25519-key" under the secret, in a self-signed certificate with
/// fixed names, serial and validity. Ed25519 signs deterministically, so
/// every node derives the same bytes, and each node's certificate is both
/// what it presents and the one trust anchor it checks its peer against:
/// completing a handshake proves the peer holds the key, which only the
/// secret yields. Throws h2::error when OpenSSL fails (never for any
/// secret). Any thread.
tls_credentials derive_tls_credentials(const job_secret& secret);

} // namespace h2::transport
