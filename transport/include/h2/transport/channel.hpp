// DiComm's channel (docs/architecture.md, Contracts): ordered, tagged, asynchronous
// send/recv of tensors and byte buffers between two endpoints. Errors (peer
// gone, timeout, corrupt frame) surface as transport_error at the waiting
// call, never as a hang: every wait takes a timeout chosen by the caller.
//
// Backends (transport/<backend>/) implement the same interface: inproc
// today; shm, tcp and rdma share it.
#pragma once

#include "h2/core/error.hpp"

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

namespace h2::transport {

/// When the sender sent a frame, on both of its clocks (docs/emulation.md: a
/// receive completes at max(receiver clock, send clock + link time)).
struct clock_stamp {
  double virtual_seconds = 0;
  double wall_seconds = 0;
};

/// One unit of transfer: a tag, the sender's clock, and a payload that is
/// either a tensor or a byte buffer.
/// Leaves the elements it makes uninitialised: a received payload's buffer
/// is written whole before anyone reads it, so it is never zero-filled,
/// and a header that announces bytes which never come costs address space,
/// not memory (docs/transport.md, Bounds).
template <class T>
struct uninitialized_allocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = uninitialized_allocator<U>;
  };
  uninitialized_allocator() = default;
  template <class U>
  uninitialized_allocator(const uninitialized_allocator<U>&) noexcept {}

  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0)
      ::new (static_cast<void*>(p)) U;
    else
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

/// A message's byte payload.
using byte_buffer = std::vector<std::byte, uninitialized_allocator<std::byte>>;

struct message {
  std::uint64_t tag = 0;
  clock_stamp sent;
  at::Tensor tensor; ///< defined for tensor payloads
  byte_buffer bytes; ///< the payload otherwise

  /// Bytes of the payload (tensor data or byte buffer).
  std::uint64_t payload_bytes() const noexcept;
};

/// A channel whose receives take arrived messages themselves, on the
/// waiting thread (the framed channels of shm, tcp and rdma: the waiter
/// reads the link; docs/transport.md, Receiving), so that a message costs
/// at most one thread wake-up, and none while the waiter polls. Held by
/// pending receives: calls must stay safe (and do nothing) once the channel
/// is gone.
class receive_progress {
public:
  virtual ~receive_progress() = default;

  /// Delivers whatever has arrived, without blocking. Thread-safe; a no-op
  /// while another thread is doing it. A failure of the link fails the
  /// channel's receives (it is not thrown here).
  virtual void poll() noexcept = 0;

  /// Returns once `done` is set (this thread or another delivered the
  /// message, or failed the receive) or at `until`: polls the link for a
  /// while, then sleeps on it, delivering whatever arrives meanwhile.
  virtual void wait(const std::atomic<bool>& done,
                    std::chrono::steady_clock::time_point until) noexcept = 0;
};

/// A receive in progress; get() waits for it. Movable, single use.
class pending_message {
public:
  struct state; // shared with the channel that completes it

  explicit pending_message(std::shared_ptr<state> s) : state_(std::move(s)) {}

  /// Waits up to `timeout` for the message. Throws transport_error:
  /// timeout, peer_closed, cancelled, corrupt_frame.
  message get(std::chrono::duration<double> timeout);

  /// True once get() would return or throw without waiting.
  bool ready() const;

private:
  std::shared_ptr<state> state_;
};

/// What one end of a channel takes from its peer before it fails the
/// channel with corrupt_frame (docs/transport.md, Bounds). The runtime
/// sets them from the live plan (runtime::channel_limits_of) and again
/// whenever the plan changes.
struct channel_limits {
  /// Largest payload of one message.
  std::uint64_t max_payload_bytes = std::uint64_t{1} << 36;
  /// Most messages arrived for tags no receive waits for yet.
  std::size_t max_unawaited = 4096;
};

/// Traffic through one end of a channel.
struct channel_stats {
  std::uint64_t messages_sent = 0;
  std::uint64_t messages_received = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  /// Of bytes_sent, those that left from device memory rather than staged
  /// through host memory (CUDA IPC, rdma's device-direct path).
  std::uint64_t bytes_sent_on_device = 0;
};

class channel {
public:
  virtual ~channel() = default;

  /// Queues `m` for the peer; returns once the payload may be reused (the
  /// in-process backend hands tensors over without copying, so the sender
  /// must not modify a sent tensor in place). Throws transport_error
  /// (peer_closed, cancelled).
  virtual void send(message m) = 0;

  /// Starts receiving the next message with `tag`. Messages of one tag
  /// arrive in the order they were sent.
  virtual pending_message recv_async(std::uint64_t tag) = 0;

  /// recv_async(tag).get(timeout).
  message recv(std::uint64_t tag, std::chrono::duration<double> timeout) {
    return recv_async(tag).get(timeout);
  }

  /// Closes this end: its waiting and later calls fail with `cancelled`, the
  /// peer's with `peer_closed`. Idempotent; callable from any thread.
  virtual void close() noexcept = 0;

  /// "inproc", "shm", "tcp", "rdma".
  virtual std::string_view backend() const noexcept = 0;

  virtual channel_stats stats() const = 0;

  /// Bounds what the peer may send from now on. The in-process backend's
  /// peer is this process: it ignores them.
  virtual void set_limits(const channel_limits&) {}

  /// Passes this end's CUDA tensors to the peer in device memory, and lands
  /// those the peer passes so on CUDA device `device` (this end's chip's
  /// ordinal): shm between CUDA chips of one host, by CUDA IPC
  /// (docs/transport.md, "Device memory"). Without it they go through
  /// pinned host memory. The runtime calls it where both chips are CUDA
  /// GPUs (job key transport.cuda_ipc), before either sends. Backends that
  /// cannot pass device memory ignore it.
  virtual void share_device_memory(int /*device*/) {}
};

// ---------------------------------------------------------------------------
// Shared by the backends: the completion state behind pending_message.

struct pending_message::state {
  std::mutex mutex;
  std::condition_variable ready;
  /// Set (under `mutex`) when the receive ends; read without the lock by
  /// get()'s short spin before it sleeps.
  std::atomic<bool> done{false};
  std::optional<message> value;
  std::optional<transport_error> failure;
  std::uint64_t tag = 0;
  /// Set when the channel lets its waiters poll (null otherwise).
  std::shared_ptr<receive_progress> progress;

  /// Delivers `m` unless the receive already ended (timed out, failed);
  /// returns whether it was taken. `m` is left untouched when not taken.
  bool complete(message& m);
  /// Fails the receive unless it already ended.
  void fail(const transport_error& e);
  /// True once completed, failed or timed out.
  bool ended();
};

} // namespace h2::transport
