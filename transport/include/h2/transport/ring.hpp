// Byte rings shared by the backends that move a stream through a buffer of
// fixed size: shm (a ring in a shared segment) and rdma (a ring in the
// receiver's registered memory, written one-sidedly by the sender).
//
// Positions count bytes since the stream began and never wrap; a position's
// place in the ring is the position modulo the capacity, so one transfer
// covers up to two contiguous pieces (up to the ring's end, then from its
// start). The writer owns the head, the reader the tail; the writer may add
// capacity - (head - tail) bytes.
//
// Where the reader cannot publish its tail in memory the writer reads (rdma),
// it returns consumed bytes as credits; credit_writer and credit_reader keep
// that bookkeeping. Pure logic, no I/O, no locks: the owner serialises.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>

namespace h2::transport::ring {

/// A contiguous part of a ring: `bytes` bytes from `offset`.
struct piece {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

/// Where a transfer lies in a ring: `first` up to the ring's end, `second`
/// from the start (empty, bytes == 0, when the transfer does not wrap).
struct pieces {
  piece first;
  piece second;

  /// 1 or 2 (1 for an empty transfer too).
  int count() const noexcept { return second.bytes == 0 ? 1 : 2; }
};

/// The offset of stream position `position` in a ring of `capacity` bytes.
constexpr std::uint64_t offset_of(std::uint64_t position,
                                  std::uint64_t capacity) noexcept {
  return position % capacity;
}

/// The pieces `bytes` bytes from `position` occupy. Requires
/// bytes <= capacity.
constexpr pieces split(std::uint64_t position, std::uint64_t bytes,
                       std::uint64_t capacity) noexcept {
  const std::uint64_t at = offset_of(position, capacity);
  const std::uint64_t first = bytes < capacity - at ? bytes : capacity - at;
  return {{at, first}, {0, bytes - first}};
}

/// Whether a head and a tail can belong to one ring: the tail never passes
/// the head and the head never laps the tail. A peer that reports positions
/// outside this is corrupt.
constexpr bool consistent(std::uint64_t head, std::uint64_t tail,
                          std::uint64_t capacity) noexcept {
  return tail <= head && head - tail <= capacity;
}

/// Bytes written and not yet consumed. Requires consistent().
constexpr std::uint64_t used(std::uint64_t head, std::uint64_t tail) noexcept {
  return head - tail;
}

/// Bytes the writer may add. Requires consistent().
constexpr std::uint64_t free_space(std::uint64_t head, std::uint64_t tail,
                                   std::uint64_t capacity) noexcept {
  return capacity - (head - tail);
}

/// Copies `n` bytes from `src` into `ring` at stream position `position`.
/// Requires n <= capacity.
inline void copy_in(void* ring, std::uint64_t capacity, std::uint64_t position,
                    const void* src, std::size_t n) noexcept {
  const auto p = split(position, n, capacity);
  auto* base = static_cast<char*>(ring);
  const auto* from = static_cast<const char*>(src);
  // memcpy wants valid pointers even for 0 bytes (an empty payload's may
  // be null).
  if (p.first.bytes != 0)
    std::memcpy(base + p.first.offset, from, p.first.bytes);
  if (p.second.bytes != 0)
    std::memcpy(base, from + p.first.bytes, p.second.bytes);
}

/// Copies `n` bytes at stream position `position` out of `ring` into `dst`.
/// Requires n <= capacity.
inline void copy_out(const void* ring, std::uint64_t capacity,
                     std::uint64_t position, void* dst,
                     std::size_t n) noexcept {
  const auto p = split(position, n, capacity);
  const auto* base = static_cast<const char*>(ring);
  auto* to = static_cast<char*>(dst);
  if (p.first.bytes != 0)
    std::memcpy(to, base + p.first.offset, p.first.bytes);
  if (p.second.bytes != 0)
    std::memcpy(to + p.first.bytes, base, p.second.bytes);
}

/// The writer's side of a ring in the reader's memory that it fills with
/// one-sided writes from a local staging ring of the same capacity (byte
/// `position` sits at the same offset in both). A staged byte's place may be
/// reused once the reader returned it (credit) and the local hardware
/// finished reading it (completion): whichever comes last. Writes that
/// notify the reader (RDMA WRITE WITH IMMEDIATE consumes one of the reader's
/// posted receives) are limited to `max_notifications` in flight, counted
/// until the bytes they carry are returned.
class credit_writer {
public:
  /// Requires capacity > 0 and max_notifications > 0.
  credit_writer(std::uint64_t capacity, std::uint64_t max_notifications);

  std::uint64_t capacity() const noexcept { return capacity_; }

  /// End of the bytes staged (or written straight from the caller's memory).
  std::uint64_t staged() const noexcept { return staged_; }
  /// End of the bytes whose writes were posted.
  std::uint64_t posted() const noexcept { return posted_; }
  /// End of the bytes whose writes completed locally.
  std::uint64_t completed() const noexcept { return completed_; }
  /// Bytes the reader returned.
  std::uint64_t returned() const noexcept { return returned_; }

  /// Bytes that may be staged now.
  std::uint64_t free_bytes() const noexcept;

  /// Whether one more notifying write may be posted.
  bool may_notify() const noexcept {
    return notifications_.size() < max_notifications_;
  }

  /// Notifying writes in flight (posted, their bytes not yet returned).
  std::uint64_t notifications_in_flight() const noexcept {
    return notifications_.size();
  }

  /// `n` more bytes were staged. Requires n <= free_bytes().
  void stage(std::uint64_t n);

  /// The writes covering everything up to `end` were posted, the last one
  /// notifying. Requires posted() < end <= staged() and may_notify().
  void post(std::uint64_t end);

  /// The local write ending at `end` completed (completions arrive in
  /// order; an older end is ignored). Requires end <= posted().
  void complete(std::uint64_t end);

  /// The reader returned `n` bytes. False, changing nothing, when that is
  /// more than was posted: the reader is corrupt.
  [[nodiscard]] bool credit(std::uint64_t n) noexcept;

  /// Whether every posted write completed locally.
  bool drained() const noexcept { return completed_ == posted_; }

private:
  std::uint64_t capacity_;
  std::uint64_t max_notifications_;
  std::uint64_t staged_ = 0;
  std::uint64_t posted_ = 0;
  std::uint64_t completed_ = 0;
  std::uint64_t returned_ = 0;
  std::deque<std::uint64_t> notifications_; ///< ends, oldest first
};

/// The reader's side: bytes arrive (announced by notifications), are
/// consumed, and are returned to the writer as credits. It returns credit
/// once `threshold` bytes are consumed and whenever it consumed everything
/// that arrived, so a writer waiting for space or for notifications always
/// gets credit eventually (the reader drains the ring while it waits).
class credit_reader {
public:
  /// Requires capacity > 0 and 0 < threshold <= capacity.
  credit_reader(std::uint64_t capacity, std::uint64_t threshold);

  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t arrived() const noexcept { return arrived_; }
  std::uint64_t consumed() const noexcept { return consumed_; }
  std::uint64_t credited() const noexcept { return credited_; }

  /// Bytes arrived and not yet consumed.
  std::uint64_t available() const noexcept { return arrived_ - consumed_; }

  /// `n` bytes arrived. False, changing nothing, when they would overrun
  /// the ring: the writer is corrupt.
  [[nodiscard]] bool arrive(std::uint64_t n) noexcept;

  /// `n` bytes were consumed. Requires n <= available().
  void consume(std::uint64_t n);

  /// The credit to return now (0: none is due yet).
  std::uint64_t credit_due() const noexcept;

  /// `n` bytes were returned. Requires consumed() - credited() >= n.
  void credit_sent(std::uint64_t n);

private:
  std::uint64_t capacity_;
  std::uint64_t threshold_;
  std::uint64_t arrived_ = 0;
  std::uint64_t consumed_ = 0;
  std::uint64_t credited_ = 0;
};

} // namespace h2::transport::ring
