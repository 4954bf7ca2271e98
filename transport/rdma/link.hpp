// The rdma backend's link: one RC queue pair and its two rings, data by
// RDMA WRITE WITH IMMEDIATE, consumed bytes returned as credits
// (docs/transport.md, RDMA). Private to transport/rdma/.
#pragma once

#include "verbs.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/ring.hpp"
#include "h2/transport/socket_link.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace h2::transport::rdma {

/// One RC queue pair and its two rings. One thread writes at a time
/// (framed_channel serialises), one reads; both drive the completion queue
/// under `mutex_`, and waits sleep on its completion channel
/// (docs/transport.md, Receiving).
class rdma_link final : public byte_link {
public:
  /// Takes the connection's rdma_cm id (its address resolved, or a
  /// connection request) and its own event channel; creates the queue pair
  /// and the receive ring and posts every receive, ready for
  /// rdma_connect/rdma_accept.
  rdma_link(channel_ptr channel, id_ptr id, std::unique_ptr<socket_link> socket,
            std::uint64_t ring_bytes);

  /// After the queue pair connected: tells the peer where to write, learns
  /// where it may write, and registers the staging ring that mirrors the
  /// peer's ring.
  void exchange_rings(deadline until);

  void write(std::initializer_list<buffer_view> parts, deadline until) override;
  /// Device memory of 64 KiB or more that registers (device_region).
  bool writes_from_device(buffer_view payload) override;

  /// Copies out of the receive ring what arrived; returns credit when due.
  std::size_t read_some(void* data, std::size_t size) override;
  std::uint32_t wake_count() const noexcept override;
  void wait_readable(std::uint32_t seen, deadline until) override;
  void nudge() noexcept override;
  /// wait_readable() for at most a second: the wait looks at the peer's
  /// liveness itself.
  void wait_drain(std::uint32_t seen) override;
  /// 64 KiB: each read takes the lock and polls the completion queue.
  std::size_t read_ahead_bytes() const noexcept override { return 64 << 10; }

  void shutdown() noexcept override;

  ~rdma_link() override;

  rdma_cm_id* id() const noexcept { return id_.get(); }
  rdma_event_channel* channel() const noexcept { return channel_.get(); }
  socket_link& socket() const noexcept { return *socket_; }

  std::string_view backend() const noexcept override { return "rdma"; }
  std::string peer() const override { return peer_; }

private:
  // -- writing --

  /// Copies into the staging ring and posts a write whenever a chunk is
  /// full or the ring has no room left.
  void write_staged(const char* p, std::size_t left, deadline until);

  /// Posts the staged and not yet posted bytes.
  void flush(deadline until);

  /// Writes straight from registered (device) memory into the peer's ring;
  /// returns once the hardware read it all, so the caller may reuse it.
  void write_direct(const char* p, std::size_t left, ibv_mr* mr,
                    deadline until);

  /// Whether one more notifying write (up to two work requests) may go.
  bool send_slot_free_locked() const;

  void wait_for_send_slot(deadline until);

  /// Posts [from, to) to the same positions of the peer's ring: the part up
  /// to the ring's end from `first`, the wrapped rest from `second`. Only
  /// the last write carries the immediate (the byte count): RC delivers in
  /// order, so its arrival means all of it landed.
  void post_write_locked(std::uint64_t from, std::uint64_t to,
                         const void* first, const void* second,
                         std::uint32_t lkey);

  /// Returns consumed bytes to the writer when due (ring.hpp). When the
  /// send queue is full the credit waits for the next progress().
  void send_credit_locked();

  /// Posts one receive; returns 0 or an errno value.
  int post_receive();

  // -- completions --

  void progress_locked();

  void complete_locked(const ibv_wc& wc);

  void record_failure_locked(transport_errc code, const std::string& what);

  [[noreturn]] void throw_failure_locked(transport_errc code,
                                         const std::string& what);

  // -- waiting (templates: defined in link.cpp, their only user) --

  /// One look, under `mutex_`: this end's close, new completions,
  /// `ready()`, a failure.
  template <class Ready>
  bool look_locked(Ready& ready);

  template <class Ready>
  bool attempt(Ready& ready);

  /// The turn of the one waiting thread that sleeps on the completion
  /// channel. Both ends' threads (reader, writer) share one completion
  /// queue, and an armed queue raises one event: were both to sleep on the
  /// channel, the one that took the event could leave the other asleep with
  /// its completion already polled. So one sleeps there and the other on
  /// `progressed_`, which every progress and every end of a turn signals.
  /// Constructed and destroyed with `mutex_` held.
  struct poller_turn {
    explicit poller_turn(rdma_link& l) : link(l) { link.poller_ = true; }
    poller_turn(const poller_turn&) = delete;
    poller_turn& operator=(const poller_turn&) = delete;
    ~poller_turn() {
      link.poller_ = false;
      link.progressed_.notify_all();
    }
    rdma_link& link;
  };

  /// Spins, then sleeps, until `ready()` (called under `mutex_`); checks
  /// the peer's liveness every liveness_interval and `until` while it waits.
  template <class Ready>
  void wait(Ready&& ready, std::optional<deadline> until);

  /// The bootstrap socket says the peer is gone. What it wrote before it
  /// went may complete just after its socket closed: look a little longer,
  /// then fail with peer_closed.
  template <class Ready>
  void peer_gone(Ready& ready);

  // -- device memory --

  /// A memory region for `size` bytes at `data` when they are device
  /// memory that could be registered directly; nullptr for host memory.
  ibv_mr* device_region(const void* data, std::size_t size);

  /// Device memory that cannot be registered cannot be staged either (the
  /// staging copy is a host memcpy): the caller must send it from host
  /// memory.
  [[noreturn]] void refuse_device_memory(const void* data) const;

  // Declaration order is teardown order, reversed: memory regions go before
  // the queue pair, the queue pair before its completion queue, everything
  // before the protection domain, the id and its channel last.
  channel_ptr channel_;
  id_ptr id_;
  std::unique_ptr<socket_link> socket_; ///< kept open: tells peer death
  std::string peer_;
  std::uint64_t capacity_;
  pd_ptr pd_;
  comp_ptr comp_;
  cq_ptr cq_;
  qp_guard qp_;
  region in_ring_;
  mr_ptr in_mr_;
  region staging_;
  mr_ptr staging_mr_;
  ring_info remote_;
  std::uint64_t chunk_bytes_ = max_write_bytes;
  std::map<std::uint64_t, mr_ptr> device_mrs_; ///< by CUDA buffer id

  std::mutex mutex_; ///< the completion queue and everything below
  std::condition_variable progressed_;
  bool poller_ = false; ///< a waiter sleeps on the completion channel
  std::optional<ring::credit_writer> writer_;
  ring::credit_reader reader_;
  std::uint32_t sq_outstanding_ = 0;
  std::optional<transport_error> failure_;

  fd_guard wake_; ///< readable once shut down: wakes sleeping waits
  /// Written by nudge() while a waiter polls the completion channel.
  fd_guard nudged_;
  std::atomic<std::uint32_t> wakes_{0}; ///< nudge()s so far
  std::atomic<bool> shut_{false};
};

} // namespace h2::transport::rdma
