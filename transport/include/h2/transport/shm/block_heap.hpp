// The writer's bookkeeping of a heap of bytes shared with a reader: shm
// places large payloads in blocks of the reader's heap, the reader adopts a
// block as its received tensor and frees it whenever that tensor dies, in
// any order. First fit from the lowest offset, so a pipeline sending the
// same few shapes keeps reusing the same (cache-warm, already faulted-in)
// blocks; adjacent free extents merge. Pure logic, no I/O, no locks: the
// one writing thread owns it (docs/transport.md, shm).
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace h2::transport::shm {

class block_heap {
public:
  /// A heap of `capacity` bytes whose blocks start at multiples of
  /// `alignment`. Requires alignment a power of two and capacity a multiple
  /// of it (0 is an empty heap that allocates nothing).
  block_heap(std::uint64_t capacity, std::uint64_t alignment);

  /// The offset of a new block of `bytes` bytes (its extent rounded up to
  /// the alignment), or nullopt when no free extent is large enough.
  /// Requires bytes > 0.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);

  /// Where allocate(bytes) would put the block now, changing nothing.
  std::optional<std::uint64_t> where(std::uint64_t bytes) const;

  /// Frees the block that starts at `offset`. False, changing nothing, when
  /// no block starts there: the reader is corrupt or freed it twice.
  [[nodiscard]] bool release(std::uint64_t offset) noexcept;

  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t alignment() const noexcept { return alignment_; }
  /// Bytes in no block.
  std::uint64_t free_bytes() const noexcept { return free_bytes_; }
  /// Blocks allocated and not yet released.
  std::size_t blocks() const noexcept { return used_.size(); }
  /// The largest block allocate() could return now.
  std::uint64_t largest_free() const noexcept;
  /// The end of the highest extent ever allocated: memory below it has
  /// been used before (shm: its pages are faulted in), memory above never.
  std::uint64_t high_water() const noexcept { return high_water_; }

private:
  std::uint64_t extent_of(std::uint64_t bytes) const;
  std::map<std::uint64_t, std::uint64_t>::const_iterator
  first_fit(std::uint64_t extent) const;

  std::uint64_t capacity_;
  std::uint64_t alignment_;
  std::uint64_t free_bytes_;
  std::uint64_t high_water_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_; ///< offset -> extent bytes
  std::map<std::uint64_t, std::uint64_t> used_; ///< offset -> extent bytes
};

/// The reader's side: the blocks of its peer's heap it has adopted and not
/// yet freed. A placement that overlaps one of them is the peer's lie (two
/// tensors would alias one block), which the reader refuses as a corrupt
/// frame. Pure logic, no locks: the caller serialises.
class adopted_blocks {
public:
  /// Records bytes [offset, offset + bytes) as adopted. False, changing
  /// nothing, when they overlap a block adopted and not yet released.
  /// Requires bytes > 0 and no overflow (the caller checked the heap's
  /// bounds).
  [[nodiscard]] bool adopt(std::uint64_t offset, std::uint64_t bytes);

  /// Forgets the block adopted at `offset`.
  void release(std::uint64_t offset) noexcept;

  /// Blocks adopted and not yet released.
  std::size_t size() const noexcept { return live_.size(); }

private:
  std::map<std::uint64_t, std::uint64_t> live_; ///< offset -> end
};

} // namespace h2::transport::shm
