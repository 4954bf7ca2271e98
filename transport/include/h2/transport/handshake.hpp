// Who may talk to a job: the job's secret, the handshake every byte-stream
// connection starts with, and the join proof and job digest a node presents
// to the coordinator (docs/transport.md, Handshake; Nodes, launch and
// failures).
#pragma once

#include "h2/transport/link.hpp"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace h2::transport {

/// The job's secret: every node proves it knows it before any plan or
/// tensor reaches it (docs/transport.md, Handshake). Only HMACs of it cross
/// the wire. Immutable; shared between threads.
class job_secret {
public:
  explicit job_secret(std::string bytes);

  /// Reads a token file; trailing white space is ignored. Throws
  /// config_error (key `security.secret_file`) when unreadable or empty.
  static job_secret from_file(const std::string& path);

  /// HMAC-SHA256 of `message` under the secret.
  std::array<std::uint8_t, 32> prove(const std::string& message) const;

private:
  std::string bytes_;
};

/// What a finished handshake established.
struct handshake_result {
  std::uint64_t channel = 0;
  std::uint32_t peer_rank = 0;
};

/// The dialing side's handshake for `channel`: sends a challenge, checks the
/// acceptor's proof, proves itself. Throws transport_error: protocol_mismatch
/// (other version), unauthorized (wrong secret, on either side), timeout,
/// peer_closed, corrupt_frame.
handshake_result dial_handshake(byte_link& link, const job_secret& secret,
                                std::uint64_t channel, std::uint32_t rank,
                                deadline until);

/// The accepting side's handshake: learns the channel from the dialer.
handshake_result accept_handshake(byte_link& link, const job_secret& secret,
                                  std::uint32_t rank, deadline until);

/// A fresh nonce for a node's join: 32 random bytes as 64 hex digits.
/// Throws h2::random_error when the kernel's RNG fails.
std::string make_nonce();

/// What node `rank` returns for the coordinator's `nonce` to prove it knows
/// `secret`: the hex HMAC-SHA256 of "join/<nonce>/<rank>". Deterministic;
/// any thread.
std::string join_proof(const job_secret& secret, std::string_view nonce,
                       int rank);

/// Whether `proof` is join_proof(secret, nonce, rank), compared in
/// constant time (a wrong proof takes as long as a right one).
bool join_proof_valid(const job_secret& secret, std::string_view nonce,
                      int rank, std::string_view proof);

/// The hex SHA-256 of a job file's text, which every node must share with
/// the coordinator.
std::string job_digest(std::string_view job_text);

} // namespace h2::transport
