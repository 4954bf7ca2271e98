// The protocol core shared by the byte-stream backends (shm, tcp, rdma):
// frames (wire.hpp) over a byte_link, the handshake that checks the protocol
// version and the job's secret, tags and clock stamps, and the mapping of
// link failures to typed errors at the waiting call. A backend only provides
// the byte_link: how bytes move between two processes.
#pragma once

#include "h2/transport/channel.hpp"
#include "h2/transport/mailbox.hpp"
#include "h2/transport/wire.hpp"

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace h2::transport {

using deadline = std::chrono::steady_clock::time_point;

/// A span of bytes to write.
struct buffer_view {
  const void* data;
  std::size_t size;
};

/// How bytes move between two endpoints; one per backend. One thread writes
/// at a time (framed_channel serialises), one thread reads.
class byte_link {
public:
  virtual ~byte_link() = default;

  /// Writes every part in order, blocking. Throws transport_error:
  /// peer_closed when the peer is gone, cancelled after shutdown().
  virtual void write(std::initializer_list<buffer_view> parts) = 0;

  /// Reads exactly `size` bytes into `data`, waiting at most until `until`
  /// when given. Throws transport_error: peer_closed when the stream ends
  /// before the first byte, corrupt_frame when it ends partway (a truncated
  /// frame), timeout past the deadline, cancelled after shutdown().
  virtual void read(void* data, std::size_t size,
                    std::optional<deadline> until = std::nullopt) = 0;

  /// Ends the link: blocked and later reads and writes fail; the peer sees
  /// the link closed. Thread-safe, idempotent.
  virtual void shutdown() noexcept = 0;

  /// "shm", "tcp", "rdma".
  virtual std::string_view backend() const noexcept = 0;

  /// The peer, for messages ("tcp 10.0.0.2:40123").
  virtual std::string peer() const = 0;
};

/// The job's secret: every node proves it knows it before any plan or
/// tensor reaches it (DESIGN.md, Trust). Only HMACs of it cross the wire.
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

struct framed_options {
  /// Send a CRC32C of every payload (receivers verify whenever present).
  bool crc = false;
  /// Larger incoming payloads are corrupt frames.
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 36;
};

/// A channel over an established (handshaken) byte link. A reader thread
/// turns frames into messages in the mailbox: tensors are allocated once and
/// their bytes read straight into them.
class framed_channel final : public channel {
public:
  framed_channel(std::unique_ptr<byte_link> link, framed_options options);
  ~framed_channel() override;

  void send(message m) override;
  pending_message recv_async(std::uint64_t tag) override;
  void close() noexcept override;
  std::string_view backend() const noexcept override;
  channel_stats stats() const override;

private:
  void read_loop();

  std::unique_ptr<byte_link> link_;
  framed_options options_;
  /// Where received tensors' bytes go (buffers reused once freed).
  std::shared_ptr<class receive_pool> pool_;
  mailbox inbox_;
  std::mutex write_mutex_;
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> messages_sent_{0};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::thread reader_;
};

} // namespace h2::transport
