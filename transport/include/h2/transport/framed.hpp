// The protocol core shared by the byte-stream backends (shm, tcp, rdma):
// frames (wire.hpp) over a byte_link (link.hpp), tags and clock stamps, and
// the mapping of link failures to typed errors at the waiting call. A
// backend only provides the byte_link: how bytes move between two
// processes. The handshake that precedes a channel is handshake.hpp's
// (docs/transport.md, One protocol core).
#pragma once

#include "h2/transport/channel.hpp"
#include "h2/transport/handshake.hpp" // job_secret, for existing callers
#include "h2/transport/link.hpp"
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

struct framed_options {
  /// Send a CRC32C of every payload (receivers verify whenever present).
  bool crc = false;
  /// Longest a send waits for the peer to take its bytes (a full ring or
  /// socket); past it the send throws transport_error(timeout) and the
  /// channel is failed (job key transport.timeout_seconds).
  std::chrono::milliseconds send_timeout{60000};
};

/// A channel over an established (handshaken) byte link. Frames become
/// messages in the mailbox: a tensor's bytes are read straight into the
/// tensor allocated for them, or the tensor adopts the memory its payload
/// was placed in (byte_link::place). Over every link, a receive that waits
/// reads the frames itself (receive_progress); the channel's reader thread
/// only drains what nobody waits for and notices a dead peer
/// (docs/transport.md, Receiving).
class framed_channel final : public channel {
public:
  framed_channel(std::unique_ptr<byte_link> link, framed_options options);
  ~framed_channel() override;

  void send(message m) override;
  pending_message recv_async(std::uint64_t tag) override;
  void close() noexcept override;
  std::string_view backend() const noexcept override;
  channel_stats stats() const override;
  void set_limits(const channel_limits& limits) override;
  void share_device_memory(int device) override;

private:
  class receiver;

  std::unique_ptr<byte_link> link_;
  framed_options options_;
  mailbox inbox_;
  /// Turns the link's bytes into messages: shared with waiting receives.
  std::shared_ptr<receiver> receiver_;
  std::mutex write_mutex_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> device_sharing_{false};
  std::atomic<std::uint64_t> messages_sent_{0};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_sent_on_device_{0};
  std::thread reader_;
};

} // namespace h2::transport
