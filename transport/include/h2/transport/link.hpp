// The byte stream under a framed channel: how bytes move between two
// processes, one implementation per byte-stream backend (shm/link.hpp,
// tcp/link.hpp, rdma/link.hpp; docs/transport.md, One protocol core).
#pragma once

#include "h2/transport/wire.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace h2::transport {

using deadline = std::chrono::steady_clock::time_point;

/// A span of bytes to write.
struct buffer_view {
  const void* data;
  std::size_t size;
};

/// How bytes move between two endpoints; one per backend. One thread writes
/// at a time (framed_channel serialises), one thread reads at a time.
///
/// Reads never block; waiting is separate, so that whichever thread wants
/// bytes can read for itself (docs/transport.md, Receiving): a framed
/// channel's waiting receive sleeps in wait_readable() and reads what came,
/// its reader thread sleeps in wait_drain() while no receive waits, and
/// either sends the other on with nudge().
class byte_link {
public:
  virtual ~byte_link() = default;

  /// Writes every part in order, blocking until `until` at most. Throws
  /// transport_error: peer_closed when the peer is gone, cancelled after
  /// shutdown(), timeout when the peer took no room past `until` (the link
  /// is then mid-frame: the caller ends it).
  virtual void write(std::initializer_list<buffer_view> parts,
                     deadline until) = 0;

  /// Reads exactly `size` bytes into `data`, waiting at most until `until`
  /// when given: read_some() and wait_readable() in turn, for handshakes
  /// and setup records. Throws transport_error: peer_closed when the stream
  /// ends before the first byte, corrupt_frame when it ends partway (a
  /// truncated frame), timeout past the deadline, cancelled after
  /// shutdown().
  void read(void* data, std::size_t size,
            std::optional<deadline> until = std::nullopt);

  /// Copies up to `size` bytes that have arrived into `data` without
  /// waiting; returns how many (0: none yet). One reading thread at a time.
  /// Throws transport_error: peer_closed once the peer ended the stream and
  /// everything it sent was read, cancelled after shutdown(),
  /// corrupt_frame when the peer broke the link's own bookkeeping.
  virtual std::size_t read_some(void* data, std::size_t size) = 0;

  /// The link's count of nudges, for wait_readable() and wait_drain():
  /// take it, check the condition you wait for, then wait with it; a
  /// nudge() in between is not lost.
  virtual std::uint32_t wake_count() const noexcept = 0;

  /// Sleeps until read_some() may have bytes or news (the peer's end), the
  /// count moved past `seen` (nudge()), or until `until`. Throws
  /// transport_error: timeout past `until`, peer_closed when the peer is
  /// gone (what it sent before stays readable), cancelled after shutdown().
  /// One thread at a time (a channel's watching receive, or read()).
  virtual void wait_readable(std::uint32_t seen, deadline until) = 0;

  /// Ends the waits in wait_readable() and wait_drain() that took their
  /// count before. Thread-safe; costs no system call while nobody sleeps.
  virtual void nudge() noexcept = 0;

  /// The reader thread's wait while no receive waits: returns when there is
  /// something to drain (tcp and rdma: bytes arrived; shm: the writer needs
  /// room), the peer's end, after a nudge() past `seen` (a link whose wait
  /// is not for bytes, shm, may sleep on), or after an interval of the
  /// link's choosing (shm: its liveness interval). Throws transport_error:
  /// peer_closed when the peer is gone and nothing it sent is left to
  /// read, cancelled after shutdown(). One thread at a time.
  virtual void wait_drain(std::uint32_t seen) = 0;

  /// How many bytes a reader may take ahead of the frame it reads, so that
  /// one read_some() brings a header with its small payload, or many small
  /// frames, where each read costs a system call or a lock (tcp, rdma); 0,
  /// the default, where a read is a plain copy (shm: the extra copy would
  /// cost more than it saves).
  virtual std::size_t read_ahead_bytes() const noexcept { return 0; }

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

  /// Copies `payload`, device memory of CUDA device `device` (this
  /// process's ordinal), to where the peer can copy it onto its GPU (shm:
  /// device memory this end shares by CUDA IPC) and says where
  /// (placement::on_device); nullopt when this link does not pass device
  /// memory, the payload is too small or there is no room: the caller
  /// stages it through host memory then. The copy waits for the device's
  /// work. Called by the writing thread, before it writes the frame that
  /// refers to the placement. Throws device_error when the GPU fails.
  virtual std::optional<wire::placement> place_on_device(buffer_view payload,
                                                         int device);

  /// The CUDA device (this process's ordinal) of this end's chip: device
  /// memory the peer shares is mapped there, and what it passes lands
  /// there (shm). Thread-safe; links that pass no device memory ignore it.
  virtual void set_device(int /*device*/) {}

  /// Whether write() takes `payload`, device memory, as it is and sends it
  /// straight from the device (rdma: 64 KiB or more of an allocation that
  /// registers as a dma-buf, the device-direct path); false, the default,
  /// where it must be staged through host memory. The caller waits for the
  /// device's work before the write. Called by the writing thread.
  virtual bool writes_from_device(buffer_view payload);

  /// Memory the peer placed a payload in. `release()` must be called once
  /// when the memory is no longer used (from any thread, also after the
  /// link is gone); until then the peer does not reuse it.
  struct adopted_payload {
    void* data = nullptr;
    std::function<void()> release;
    /// The CUDA device (this process's ordinal) whose memory `data` is;
    /// -1 for host memory. Device memory is copied out and released at
    /// once, not adopted as the tensor's.
    int device = -1;
  };

  /// Takes the payload the peer placed at `p`. Throws transport_error:
  /// corrupt_frame for a placement this link never makes or one outside
  /// the memory the peer may use, protocol_mismatch for device memory this
  /// process cannot map.
  virtual adopted_payload adopt(const wire::placement& p);
};

} // namespace h2::transport
