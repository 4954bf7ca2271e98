// The shm backend's machinery: the layout of the shared segment (a ring and
// a heap per direction, their control words), the futex eventcounts both
// processes sleep on, and how the segment is passed to the peer
// (docs/transport.md, shm). Private to transport/shm/.
#pragma once

#include "h2/transport/link.hpp"
#include "h2/transport/shm/block_heap.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace h2::transport::shm {

// -- futex eventcounts on shared memory (no FUTEX_PRIVATE_FLAG: they work
// across processes) --

/// Sleeps while `*word` equals `expected`, at most `timeout`.
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::chrono::nanoseconds timeout);

/// Wakes every sleeper on `word`.
void futex_wake(std::atomic<std::uint32_t>* word);

/// Bumps `seq` and wakes whoever sleeps on it.
void signal(std::atomic<std::uint32_t>& seq) noexcept;

/// Counts a sleeper in a `*_waiting` word while it lives, so that the
/// other side knows to signal() it.
class counted_sleeper {
public:
  explicit counted_sleeper(std::atomic<std::uint32_t>& waiting)
      : waiting_(waiting) {
    waiting_.fetch_add(1, std::memory_order_seq_cst);
  }
  ~counted_sleeper() { waiting_.fetch_sub(1, std::memory_order_seq_cst); }
  counted_sleeper(const counted_sleeper&) = delete;
  counted_sleeper& operator=(const counted_sleeper&) = delete;

private:
  std::atomic<std::uint32_t>& waiting_;
};

// -- the segment --

/// One direction. The ring carries frames: head and tail count bytes since
/// the start; the writer owns head, the reader tail. Sleepers count
/// themselves in a `*_waiting` word and sleep on a sequence word the other
/// side bumps after it moves (an eventcount): receives on data_seq, the
/// writer on space_seq, the reader's drain thread on drain_seq (bumped when
/// the writer finds the ring full). Large tensor payloads go to blocks of
/// the heap instead (block_heap, the writer's); the reader frees a block by
/// pushing its offset to the free queue: freed_head counts pushes (the
/// reader's), freed_tail the writer's takes. A writer whose chip is a CUDA
/// GPU may also place tensors in device memory it shares by CUDA IPC
/// (docs/transport.md, "Device memory"): it publishes the memory once
/// (device_state, after the fields it covers), its blocks come back
/// through the same free queue, marked with device_block, and the reader
/// says when it no longer maps the memory (device_mapped).
struct ring_control {
  alignas(64) std::atomic<std::uint64_t> head{0};
  alignas(64) std::atomic<std::uint64_t> tail{0};
  alignas(64) std::atomic<std::uint32_t> data_seq{0};
  std::atomic<std::uint32_t> readers_waiting{0};
  alignas(64) std::atomic<std::uint32_t> space_seq{0};
  std::atomic<std::uint32_t> writer_waiting{0};
  alignas(64) std::atomic<std::uint32_t> drain_seq{0};
  alignas(64) std::atomic<std::uint32_t> writer_closed{0};
  std::atomic<std::uint32_t> reader_closed{0};
  alignas(64) std::atomic<std::uint64_t> freed_head{0};
  alignas(64) std::atomic<std::uint64_t> freed_tail{0};
  /// 1 once the writer's shared device memory below is set.
  alignas(64) std::atomic<std::uint32_t> device_state{0};
  std::uint64_t device_bytes = 0;
  /// The GPU's PCI bus id, NUL-terminated ("0000:3b:00.0").
  char device_bus_id[16] = {};
  /// Its cudaIpcMemHandle_t.
  std::byte device_handle[64] = {};
  /// The reader's: 1 from just before it maps that memory, 2 once it
  /// unmapped it or gave up (the writer frees it only then, or once the
  /// reader's process is gone).
  std::atomic<std::uint32_t> device_mapped{0};
};

/// Marks a free queue entry as a block of the writer's device memory.
constexpr std::uint64_t device_block = std::uint64_t{1} << 63;

constexpr std::uint64_t segment_magic = 0x6d68735f4432480bULL;
constexpr std::size_t control_bytes = 4096;

/// Payloads smaller than this stream through the ring: a second copy of
/// them costs less than a block's bookkeeping.
constexpr std::uint64_t min_placed_bytes = 64 << 10;
/// Heap blocks start on pages (fast copies, no false sharing).
constexpr std::uint64_t block_alignment = 4096;
/// The most a segment may hold of ring or of heap per direction.
constexpr std::uint64_t max_region_bytes = std::uint64_t{1} << 40;

/// What the acceptor tells the dialer with the segment.
struct segment_sizes {
  std::uint64_t ring_bytes = 0; ///< each direction's ring
  std::uint64_t heap_bytes = 0; ///< each direction's heap (0: none)

  /// Entries of each direction's free queue: more blocks than this cannot
  /// be live at once (of the heap, and as many of the device memory, whose
  /// size is the heap's).
  std::uint64_t free_slots() const {
    return 2 * (heap_bytes / min_placed_bytes);
  }

  static std::uint64_t pages(std::uint64_t bytes) {
    return (bytes + 4095) / 4096 * 4096;
  }
  std::uint64_t ring_at(int direction) const {
    return control_bytes +
           static_cast<std::uint64_t>(direction) * pages(ring_bytes);
  }
  std::uint64_t heap_at(int direction) const {
    return ring_at(2) + static_cast<std::uint64_t>(direction) * heap_bytes;
  }
  std::uint64_t free_queue_at(int direction) const {
    return heap_at(2) +
           static_cast<std::uint64_t>(direction) * pages(8 * free_slots());
  }
  std::uint64_t total() const { return free_queue_at(2); }

  /// Whether a peer's sizes are ones this backend could have made.
  bool valid() const {
    return ring_bytes != 0 && ring_bytes <= max_region_bytes &&
           heap_bytes <= max_region_bytes && heap_bytes % block_alignment == 0;
  }
};

struct segment_header {
  std::uint64_t magic;
  segment_sizes sizes;
  ring_control rings[2]; ///< [0]: acceptor -> dialer, [1]: dialer -> acceptor
};
static_assert(sizeof(segment_header) <= control_bytes);

/// The mapping, shared by the link and by every received tensor that lives
/// in it: unmapped when the last of them goes.
struct segment {
  void* map = nullptr;
  std::size_t bytes = 0;
  /// Serialises this process's pushes to the free queue (tensors die on
  /// any thread) and guards `adopted`.
  std::mutex free_mutex;
  /// The blocks of the peer's heap this end holds as received tensors.
  adopted_blocks adopted;

  ~segment();

  char* at(std::uint64_t offset) const {
    return static_cast<char*>(map) + offset;
  }
};

// -- passing the segment --

/// Sends the segment's descriptor `fd` and its sizes over Unix socket
/// `socket` (SCM_RIGHTS). Throws transport_error(peer_closed).
void send_fd(int socket, int fd, segment_sizes sizes);

/// Receives what send_fd() sent by `until`; returns the descriptor (the
/// caller owns it). Throws transport_error: timeout, corrupt_frame.
int receive_fd(int socket, segment_sizes& sizes, deadline until);

/// Maps `bytes` of segment `fd` shared. Throws transport_error(peer_closed).
void* map_segment(int fd, std::size_t bytes);

} // namespace h2::transport::shm
