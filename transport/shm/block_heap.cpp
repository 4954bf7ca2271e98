#include "h2/transport/shm/block_heap.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <iterator>

namespace h2::transport::shm {

block_heap::block_heap(std::uint64_t capacity, std::uint64_t alignment)
    : capacity_(capacity), alignment_(alignment), free_bytes_(capacity) {
  H2_ENFORCE(alignment > 0 && (alignment & (alignment - 1)) == 0 &&
               capacity % alignment == 0,
             "capacity ", capacity, ", alignment ", alignment);
  if (capacity > 0)
    free_.emplace(0, capacity);
}

std::uint64_t block_heap::extent_of(std::uint64_t bytes) const {
  H2_ENFORCE(bytes > 0, "an empty block");
  return (bytes + alignment_ - 1) & ~(alignment_ - 1);
}

std::map<std::uint64_t, std::uint64_t>::const_iterator
block_heap::first_fit(std::uint64_t extent) const {
  return std::find_if(free_.begin(), free_.end(),
                      [&](const auto& f) { return f.second >= extent; });
}

std::optional<std::uint64_t> block_heap::where(std::uint64_t bytes) const {
  if (bytes > capacity_)
    return std::nullopt;
  auto it = first_fit(extent_of(bytes));
  if (it == free_.end())
    return std::nullopt;
  return it->first;
}

std::optional<std::uint64_t> block_heap::allocate(std::uint64_t bytes) {
  if (bytes > capacity_)
    return std::nullopt;
  const std::uint64_t extent = extent_of(bytes);
  auto it = first_fit(extent);
  if (it == free_.end())
    return std::nullopt;
  const std::uint64_t offset = it->first;
  const std::uint64_t left = it->second - extent;
  free_.erase(it);
  if (left > 0)
    free_.emplace(offset + extent, left);
  used_.emplace(offset, extent);
  free_bytes_ -= extent;
  high_water_ = std::max(high_water_, offset + extent);
  return offset;
}

bool block_heap::release(std::uint64_t offset) noexcept {
  auto used = used_.find(offset);
  if (used == used_.end())
    return false;
  std::uint64_t start = offset;
  std::uint64_t extent = used->second;
  used_.erase(used);
  free_bytes_ += extent;
  // Merge with the free extents on either side.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + extent) {
    extent += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      extent += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, extent);
  return true;
}

std::uint64_t block_heap::largest_free() const noexcept {
  std::uint64_t best = 0;
  for (const auto& [offset, extent] : free_)
    best = std::max(best, extent);
  return best;
}

bool adopted_blocks::adopt(std::uint64_t offset, std::uint64_t bytes) {
  const std::uint64_t end = offset + bytes;
  auto next = live_.lower_bound(offset);
  if (next != live_.end() && next->first < end)
    return false; // a live block starts inside the new one
  if (next != live_.begin() && std::prev(next)->second > offset)
    return false; // the new one starts inside a live block
  live_.emplace(offset, end);
  return true;
}

void adopted_blocks::release(std::uint64_t offset) noexcept {
  live_.erase(offset);
}

} // namespace h2::transport::shm
