// Who may talk to a job: the job's secret, the handshake every byte-stream
// connection starts with, and the join proof and job digest a node presents
// to the coordinator (docs/transport.md, Handshake; Nodes, launch and
// failures).
#pragma once

#include "h2/transport/link.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace h2::transport {

/// The job's secret: every node proves it knows it before any plan or
/// tensor reaches it (docs/transport.md, Handshake). Only HMACs of it cross
/// the wire. Immutable; shared between threads.
class job_secret {
public:
  explicit job_secret(std::string bytes);

  /// Reads a token file (read_token_file: private, at least 16 bytes,
  /// trailing white space ignored). Throws config_error at
  /// `security.secret_file`.
  static job_secret from_file(const std::string& path);

  /// HMAC-SHA256 of `message` under the secret.
  std::array<std::uint8_t, 32> prove(const std::string& message) const;

private:
  std::string bytes_;
};

/// Bytes a secret or token must have at least.
inline constexpr std::size_t min_token_bytes = 16;

/// The text of a secret or token file, trailing white space removed. The
/// file must not be readable by group or others and must hold at least
/// min_token_bytes. Throws config_error at `key` naming the file and what
/// is wrong ("<what> \"path\" is readable by group or others: chmod 600
/// it").
std::string read_token_file(const std::string& path, const std::string& key,
                            const std::string& what);

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

/// What makes a control message between the nodes of a job trusted
/// (docs/transport.md, "Control messages"): its sender's rank, a sequence
/// number the sender never reuses, and the hex HMAC-SHA256 under the job's
/// secret of "control/<type>/<sender>/<seq>/<payload>".
struct control_seal {
  std::int32_t sender = 0;
  std::uint64_t seq = 0;
  std::string mac;
};

/// The seal of message `seq` of `sender` of `type` carrying `payload`
/// (control_signer numbers them itself; a client that outlives no process,
/// such as h2-admin, brings its own increasing numbers).
control_seal seal_control(const job_secret& secret, std::string_view type,
                          int sender, std::uint64_t seq,
                          std::string_view payload);

/// Seals one sender's control messages with increasing sequence numbers.
/// Thread-safe.
class control_signer {
public:
  control_signer(std::shared_ptr<const job_secret> secret, int sender);

  /// The seal of a message of `type` carrying `payload`.
  control_seal seal(std::string_view type, std::string_view payload);

private:
  std::shared_ptr<const job_secret> secret_;
  int sender_;
  std::atomic<std::uint64_t> next_{1};
};

/// Checks sealed control messages: the MAC (in constant time) and, per
/// sender, a sequence number above every one accepted before (a replay or
/// a stale message is refused). Not thread-safe: one per receiving actor.
class control_verifier {
public:
  explicit control_verifier(std::shared_ptr<const job_secret> secret);

  /// Whether `seal` is a valid seal of a message of `type` carrying
  /// `payload`; a valid one raises its sender's floor.
  bool accept(std::string_view type, const control_seal& seal,
              std::string_view payload);

private:
  std::shared_ptr<const job_secret> secret_;
  std::map<std::int32_t, std::uint64_t> last_;
};

/// The hex SHA-256 of a job file's text, which every node must share with
/// the coordinator.
std::string job_digest(std::string_view job_text);

} // namespace h2::transport
