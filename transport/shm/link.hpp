// The shm backend's link: frames through one ring of the shared segment per
// direction, large tensors placed in the reader's heap (docs/transport.md,
// shm). Private to transport/shm/.
#pragma once

#include "segment.hpp"

#include "h2/transport/report.hpp"
#include "h2/transport/shm/block_heap.hpp"
#include "h2/transport/socket_link.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

namespace h2::transport::shm {

/// How long a sleeping side waits before it checks that its peer lives,
/// and how often the drain thread takes what nobody waits for.
constexpr std::chrono::milliseconds liveness_interval{20};

/// One end of a channel's segment. Receives read the ring themselves and
/// sleep on a futex the writer wakes (docs/transport.md, Receiving); one
/// thread writes at a time.
class shm_link final : public byte_link {
public:
  /// `acceptor`: which of the segment's two directions this end writes.
  /// `socket`, the bootstrap connection, stays open: its end tells this
  /// end that the peer's process is gone. `log` hears that device memory
  /// could not be shared (its tensors are staged then).
  shm_link(std::shared_ptr<segment> seg, bool acceptor,
           std::unique_ptr<socket_link> socket, log_sink log = {});
  ~shm_link() override;

  void write(std::initializer_list<buffer_view> parts, deadline until) override;
  std::optional<wire::placement> place(buffer_view payload) override;
  std::optional<wire::placement> place_on_device(buffer_view payload,
                                                 int device) override;
  void set_device(int device) override;
  adopted_payload adopt(const wire::placement& p) override;
  std::size_t read_some(void* data, std::size_t size) override;
  std::uint32_t wake_count() const noexcept override;
  void wait_readable(std::uint32_t seen, deadline until) override;
  void nudge() noexcept override;
  void wait_drain(std::uint32_t seen) override;
  void shutdown() noexcept override;
  std::string_view backend() const noexcept override { return "shm"; }
  std::string peer() const override { return "(same host)"; }

private:
  /// The device memory this end shares and the peer's it mapped (CUDA
  /// IPC; defined in link.cpp).
  struct device_memory;

  bool readable() const noexcept;

  /// The peer's device placement `p`, mapped (adopt()).
  adopted_payload adopt_on_device(const wire::placement& p);

  /// At the end: unmaps the peer's device memory and says so, then frees
  /// this end's once the peer unmapped it too (or its process is gone);
  /// memory the peer still maps after a while is kept, not freed.
  void release_device_memory() noexcept;

  /// This end's shared memory on `device`, made and published on first
  /// use; null when it cannot be (the payloads are staged then).
  void* shared_device_memory(int device);

  /// A block of the heap for `bytes`, or nullopt (the payload streams).
  std::optional<std::uint64_t> allocate_block(std::uint64_t bytes);

  /// A block of the shared device memory for `bytes`, waiting up to
  /// free_wait for the reader to return one; nullopt (staged) past it.
  std::optional<std::uint64_t> allocate_device_block(std::uint64_t bytes);

  /// Waits until the reader returned a block or `until`; false at `until`.
  bool wait_for_free(std::chrono::steady_clock::time_point until);

  /// Returns the blocks the reader freed to the heap.
  void take_freed_blocks() noexcept;

  /// Spins for `spin`, then sleeps on `seq` until `ready()` or until `seq`
  /// moves from `seen` (defined in link.cpp, its only user).
  template <class Ready>
  void wait(Ready&& ready, std::atomic<std::uint32_t>& seq,
            std::atomic<std::uint32_t>& waiting, std::uint32_t seen,
            std::optional<deadline> until, std::chrono::nanoseconds spin);

  void check_shut() const;

  std::shared_ptr<segment> segment_;
  std::unique_ptr<socket_link> socket_; ///< kept open: tells peer death
  segment_sizes sizes_;
  block_heap heap_; ///< the blocks of out_heap_ (this end writes them)
  /// The blocks of the device memory this end shares (as large as heap_).
  block_heap device_heap_;
  std::unique_ptr<device_memory> device_;
  /// The chip's CUDA device, for the peer's device payloads (-1: unset).
  std::atomic<int> local_device_{-1};
  /// The peer's process (SO_PEERCRED; 0 when unknown).
  int peer_pid_ = 0;
  log_sink log_;
  ring_control* out_;
  ring_control* in_;
  char* out_data_;
  char* in_data_;
  char* out_heap_;
  char* in_heap_;
  std::uint64_t* out_free_;
  std::uint64_t* in_free_;
  /// The last wait for a freed block timed out (allocate_block).
  bool reader_holds_ = false;
  std::atomic<bool> shut_{false};
};

} // namespace h2::transport::shm
