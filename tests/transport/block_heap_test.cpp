// The writer's bookkeeping of shm's placed payloads (block_heap.hpp):
// first fit from the lowest offset, blocks freed in any order, free extents
// merged, and a reader's bad or repeated free refused.
#include "h2/transport/shm/block_heap.hpp"

#include "h2/core/error.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>

namespace h2::transport::shm {
namespace {

TEST(transport_block_heap, blocks_are_aligned_and_first_fit) {
  block_heap h(1024, 64);
  EXPECT_EQ(h.allocate(1), 0u);
  EXPECT_EQ(h.allocate(64), 64u);
  EXPECT_EQ(h.allocate(65), 128u); // two units
  EXPECT_EQ(h.free_bytes(), 1024u - 64 - 64 - 128);
  EXPECT_EQ(h.blocks(), 3u);
  // The lowest hole that fits is reused first.
  ASSERT_TRUE(h.release(64));
  EXPECT_EQ(h.allocate(10), 64u);
}

TEST(transport_block_heap, where_tells_without_allocating) {
  block_heap h(1024, 64);
  EXPECT_EQ(h.where(100), 0u);
  EXPECT_EQ(h.blocks(), 0u);
  EXPECT_EQ(h.allocate(100), 0u);
  EXPECT_EQ(h.where(1), 128u);
  EXPECT_EQ(h.where(1025), std::nullopt);
  EXPECT_EQ(h.where(1024 - 128 + 1), std::nullopt);
  EXPECT_THROW(h.where(0), internal_error);
}

TEST(transport_block_heap, high_water_marks_memory_used_before) {
  block_heap h(1024, 64);
  EXPECT_EQ(h.high_water(), 0u);
  auto a = h.allocate(64);
  auto b = h.allocate(200); // 256 bytes at 64
  EXPECT_EQ(h.high_water(), 320u);
  ASSERT_TRUE(h.release(*a));
  ASSERT_TRUE(h.release(*b));
  // Freeing never lowers it; reusing low blocks never raises it.
  EXPECT_EQ(h.high_water(), 320u);
  EXPECT_EQ(h.allocate(300), 0u);
  EXPECT_EQ(h.high_water(), 320u);
  EXPECT_EQ(h.allocate(64), 320u);
  EXPECT_EQ(h.high_water(), 384u);
}

TEST(transport_block_heap, a_full_heap_allocates_nothing) {
  block_heap h(256, 64);
  EXPECT_EQ(h.allocate(257), std::nullopt);
  EXPECT_EQ(h.allocate(256), 0u);
  EXPECT_EQ(h.allocate(1), std::nullopt);
  EXPECT_EQ(h.largest_free(), 0u);
  block_heap empty(0, 64);
  EXPECT_EQ(empty.allocate(1), std::nullopt);
  EXPECT_THROW(h.allocate(0), internal_error);
  EXPECT_THROW(block_heap(100, 64), internal_error);
  EXPECT_THROW(block_heap(256, 48), internal_error);
}

TEST(transport_block_heap, freed_neighbours_merge_in_any_order) {
  block_heap h(64 * 4, 64);
  auto a = h.allocate(64), b = h.allocate(64), c = h.allocate(64),
       d = h.allocate(64);
  ASSERT_TRUE(a && b && c && d);
  ASSERT_TRUE(h.release(*b));
  ASSERT_TRUE(h.release(*d));
  EXPECT_EQ(h.largest_free(), 64u); // two holes, not adjacent
  EXPECT_EQ(h.allocate(128), std::nullopt);
  ASSERT_TRUE(h.release(*c)); // joins b and d
  EXPECT_EQ(h.largest_free(), 192u);
  ASSERT_TRUE(h.release(*a));
  EXPECT_EQ(h.largest_free(), 256u);
  EXPECT_EQ(h.free_bytes(), 256u);
  EXPECT_EQ(h.blocks(), 0u);
  EXPECT_EQ(h.allocate(256), 0u);
}

TEST(transport_block_heap, a_bad_or_repeated_release_changes_nothing) {
  block_heap h(1024, 64);
  auto a = h.allocate(100);
  ASSERT_TRUE(a);
  EXPECT_FALSE(h.release(*a + 64)); // inside a block, not its start
  EXPECT_FALSE(h.release(512));     // free space
  EXPECT_FALSE(h.release(1 << 20)); // outside the heap
  EXPECT_TRUE(h.release(*a));
  EXPECT_FALSE(h.release(*a)); // twice
  EXPECT_EQ(h.free_bytes(), 1024u);
  EXPECT_EQ(h.largest_free(), 1024u);
}

/// Random allocations and releases against a reference list of blocks: no
/// two blocks overlap, every block lies in the heap at the alignment, the
/// free count is exact, and once everything is released the heap is one
/// extent again.
TEST(transport_block_heap, random_traffic_never_overlaps) {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    constexpr std::uint64_t capacity = 1 << 16, alignment = 64;
    block_heap h(capacity, alignment);
    std::map<std::uint64_t, std::uint64_t> live; // offset -> extent
    for (int step = 0; step < 5000; ++step) {
      if (live.empty() || rng() % 3 != 0) {
        std::uint64_t bytes = 1 + rng() % 6000;
        auto at = h.allocate(bytes);
        std::uint64_t extent = (bytes + alignment - 1) / alignment * alignment;
        if (!at) {
          EXPECT_LT(h.largest_free(), extent);
          continue;
        }
        EXPECT_EQ(*at % alignment, 0u);
        EXPECT_LE(*at + extent, capacity);
        auto next = live.lower_bound(*at);
        if (next != live.end()) {
          EXPECT_LE(*at + extent, next->first);
        }
        if (next != live.begin()) {
          auto prev = std::prev(next);
          EXPECT_LE(prev->first + prev->second, *at);
        }
        live.emplace(*at, extent);
      } else {
        auto it =
          std::next(live.begin(), static_cast<long>(rng() % live.size()));
        EXPECT_TRUE(h.release(it->first));
        live.erase(it);
      }
      std::uint64_t used = 0;
      for (const auto& [offset, extent] : live)
        used += extent;
      ASSERT_EQ(h.free_bytes(), capacity - used);
      ASSERT_EQ(h.blocks(), live.size());
    }
    for (const auto& [offset, extent] : live)
      EXPECT_TRUE(h.release(offset));
    EXPECT_EQ(h.largest_free(), capacity);
  }
}

TEST(transport_adopted_blocks, a_block_adopted_twice_or_still_live_is_refused) {
  adopted_blocks held;
  EXPECT_TRUE(held.adopt(0, 65536));
  EXPECT_TRUE(held.adopt(65536, 8192));  // adjacent: fine
  EXPECT_FALSE(held.adopt(0, 65536));    // the same block again
  EXPECT_FALSE(held.adopt(4096, 4096));  // inside a live one
  EXPECT_FALSE(held.adopt(61440, 8192)); // across the boundary of two
  EXPECT_FALSE(held.adopt(69632, 1));    // the last byte of the second
  EXPECT_EQ(held.size(), 2u);
  held.release(0);
  EXPECT_TRUE(held.adopt(4096, 4096)); // freed: the writer may reuse it
  EXPECT_FALSE(held.adopt(0, 8192));   // but not over what is live again
  held.release(4096);
  held.release(65536);
  held.release(12345); // nothing there: no-op
  EXPECT_EQ(held.size(), 0u);
}

} // namespace
} // namespace h2::transport::shm
