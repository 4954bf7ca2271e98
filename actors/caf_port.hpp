// How the nodes' actor systems reach each other (private to actors/,
// docs/transport.md, "TLS"): mutual TLS by default with the identity every
// node derives from the job's secret (or the operator's [security] files),
// and the coordinator's port published through a doorman that bounds the
// connections still in their TLS handshake, as DiComm's endpoints bound
// theirs. No byte from a peer without the secret reaches CAF's message
// layer (BASP), and a flood of connections holds at most
// caf_port_limits::max_pending of them.
#pragma once

#include "h2/core/job.hpp"
#include "h2/transport/handshake.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace h2::actors {

/// The TLS set-up of one node's actor system. With [security] certificate,
/// key and ca_file: those files. Otherwise the job's derived identity
/// (transport::derive_tls_credentials), held in two anonymous memory files
/// that CAF reads through /proc/self/fd (CAF 0.17 loads them anew for every
/// connection, so they live as long as this object; nothing reaches the
/// disk). Destroy it after the actor system.
class caf_tls {
public:
  /// Throws config_error (at security.certificate, .key or .ca_file) when
  /// a [security] file cannot be read, h2::error when memory files fail.
  caf_tls(const job_config& job, const transport::job_secret& secret);
  ~caf_tls();

  caf_tls(const caf_tls&) = delete;
  caf_tls& operator=(const caf_tls&) = delete;

  /// Sets the OpenSSL options of `cfg` and loads CAF's OpenSSL module.
  void configure(caf::actor_system_config& cfg) const;

  /// "the job's TLS identity, derived from its secret" or "certificates
  /// checked against CA", for the node's log line.
  std::string describe() const;

  /// How a TLS handshake with host:port under this identity went.
  enum class probe_result {
    accepted,    ///< the peer took this identity (or said nothing back)
    unreachable, ///< no TCP connection (nothing listens yet, say)
    refused,     ///< the handshake failed: the peer has another identity
  };

  /// Makes one handshake with host:port and closes it (blocking, at most
  /// `timeout` per step); `why` gets OpenSSL's reason when refused. A node
  /// runs it before CAF's connect, whose failures all read alike, so that
  /// a node without the job's secret is told so at once rather than
  /// retrying until its join timeout.
  probe_result probe(const std::string& host, std::uint16_t port,
                     std::chrono::milliseconds timeout,
                     std::string& why) const;

private:
  int certificate_fd_ = -1;
  int key_fd_ = -1;
  std::string certificate_;
  std::string key_;
  std::string ca_file_;
};

/// What the coordinator's port holds at most before the TLS handshake of
/// a connection ends (the peer proved the secret by its certificate).
struct caf_port_limits {
  /// Connections in their handshake at once; one more cuts off the oldest.
  std::size_t max_pending = 64;
  /// A handshake older than this is cut off at the next connection.
  std::chrono::milliseconds handshake_timeout{10'000};
};

/// The coordinator's published port. When destroyed (before the actor
/// system), cuts off the connections still in their handshake, so that the
/// system can stop.
class guarded_port {
public:
  guarded_port() = default;
  guarded_port(caf::actor middleman, caf::actor keeper, std::uint16_t port)
      : middleman_(std::move(middleman)), keeper_(std::move(keeper)),
        port_(port) {}
  ~guarded_port();
  guarded_port(guarded_port&&) = default;
  guarded_port& operator=(guarded_port&&) = default;

  std::uint16_t port() const { return port_; }

private:
  caf::actor middleman_;
  caf::actor keeper_; ///< sweeps and finally cuts off the handshakes
  std::uint16_t port_ = 0;
};

/// Publishes `whom` on host:port over TLS (`system` configured by caf_tls)
/// through a doorman bounded by `limits`. Port 0: any. Blocks until the
/// port listens. Throws h2::error with CAF's reason when it cannot.
guarded_port publish_guarded(caf::actor_system& system,
                             const caf::actor& whom, std::uint16_t port,
                             const std::string& host, caf_port_limits limits);

} // namespace h2::actors
