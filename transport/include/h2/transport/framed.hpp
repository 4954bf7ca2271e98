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
#include <functional>
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

  // -- Payloads outside the stream (one copy). Links that cannot place
  // payloads keep the defaults: every payload follows its header.

  /// Copies `payload` to where the peer can adopt it as its received
  /// tensor's memory (shm: a block of the reader's heap) and says where;
  /// nullopt when this link does not place payloads, the payload is too
  /// small to be worth it, or there is no room: it then follows in the
  /// stream. Called by the writing thread, before it writes the frame that
  /// refers to the placement.
  virtual std::optional<wire::placement> place(buffer_view payload);

  /// Memory the peer placed a payload in. `release()` must be called once
  /// when the memory is no longer used (from any thread, also after the
  /// link is gone); until then the peer does not reuse it.
  struct adopted_payload {
    void* data = nullptr;
    std::function<void()> release;
  };

  /// Takes the payload the peer placed at `p`. Throws transport_error
  /// (corrupt_frame) for a placement this link never makes or one outside
  /// the memory the peer may use.
  virtual adopted_payload adopt(const wire::placement& p);
};

/// A link that waiting receives read from themselves (shm): reads that do
/// not block and an eventcount to sleep on until bytes arrive. A
/// framed_channel over one lets the thread that waits for a message read
/// the frames (one wake-up per message, none while it polls); its reader
/// thread only drains what nobody waits for, when the writer runs out of
/// room or once per liveness interval, and notices a dead peer.
class polled_link : public byte_link {
public:
  /// Copies up to `size` bytes that have arrived into `data` without
  /// waiting; returns how many (0: none yet). One reading thread at a time.
  /// Throws as read() does: peer_closed once the peer ended the stream and
  /// everything it sent was read, cancelled after shutdown().
  virtual std::size_t read_some(void* data, std::size_t size) = 0;

  /// The link's count of wake-ups, for wait_readable(): take it, check the
  /// condition you wait for, then wait with it; a nudge() in between is not
  /// lost.
  virtual std::uint32_t wake_count() const noexcept = 0;

  /// Sleeps until read_some() has bytes (the writer wakes it as soon as it
  /// writes), until the wake-up count moved past `seen` (nudge()), or until
  /// `until`. Throws transport_error: timeout past `until`, peer_closed when
  /// the peer is gone, cancelled after shutdown(). Any number of threads.
  virtual void wait_readable(std::uint32_t seen, deadline until) = 0;

  /// Wakes every wait_readable(). Thread-safe.
  virtual void nudge() noexcept = 0;

  /// The reader thread's wait: returns when the writer needs room to go on,
  /// when the peer ended the stream, or after the link's liveness
  /// interval. Throws transport_error: peer_closed when the peer is gone
  /// and nothing it sent is left to read, cancelled after shutdown().
  virtual void wait_drain() = 0;
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

/// A channel over an established (handshaken) byte link. Frames become
/// messages in the mailbox: a tensor's bytes are read straight into the
/// tensor allocated for them, or the tensor adopts the memory its payload
/// was placed in (byte_link::place). A reader thread reads frames as they
/// arrive; over a polled_link, waiting receives read them instead
/// (receive_progress) and the reader thread drains what nobody waits for.
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
  class receiver;

  void read_loop();

  std::unique_ptr<byte_link> link_;
  framed_options options_;
  mailbox inbox_;
  /// Turns the link's bytes into messages: shared with waiting receives.
  std::shared_ptr<receiver> receiver_;
  std::mutex write_mutex_;
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> messages_sent_{0};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::thread reader_;
};

} // namespace h2::transport
