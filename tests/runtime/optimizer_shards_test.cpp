// ZeRO-1's layout (runtime/optimizer_shards.hpp): the buckets the
// all-reduce cuts, and each member's shares, which tile every parameter.
#include "h2/runtime/optimizer_shards.hpp"

#include <gtest/gtest.h>

namespace h2::runtime {
namespace {

TEST(runtime_optimizer_shards, buckets_hold_whole_tensors_up_to_the_limit) {
  const std::vector<std::int64_t> numels{10, 20, 5, 100, 1, 1};
  const auto b = cut_buckets(numels, 35 * 4);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].first, 0u); // 10 + 20 + 5 fits 35
  EXPECT_EQ(b[0].end, 3u);
  EXPECT_EQ(b[0].numel, 35);
  EXPECT_EQ(b[1].end, 4u); // larger than the limit: a bucket of its own
  EXPECT_EQ(b[1].numel, 100);
  EXPECT_EQ(b[2].numel, 2);
  EXPECT_TRUE(cut_buckets({}, 64).empty());
}

TEST(runtime_optimizer_shards, members_shares_tile_every_parameter) {
  const std::vector<std::int64_t> numels{10, 20, 5, 100, 1, 1, 7};
  for (std::uint64_t limit : {4ull, 35ull * 4, 1ull << 20})
    for (int size : {1, 2, 3, 5}) {
      std::vector<std::vector<int>> covered;
      for (auto n : numels)
        covered.emplace_back(static_cast<std::size_t>(n), 0);
      std::int64_t kept_max = 0, kept_min = 1 << 30;
      for (int rank = 0; rank < size; ++rank) {
        const auto shares = owned_shares(numels, limit, rank, size);
        ASSERT_EQ(shares.size(), numels.size());
        std::int64_t kept = 0;
        for (std::size_t i = 0; i < numels.size(); ++i) {
          ASSERT_GE(shares[i].offset, 0);
          ASSERT_LE(shares[i].offset + shares[i].length, numels[i]);
          for (std::int64_t e = 0; e < shares[i].length; ++e)
            ++covered[i][static_cast<std::size_t>(shares[i].offset + e)];
          kept += shares[i].length;
        }
        kept_max = std::max(kept_max, kept);
        kept_min = std::min(kept_min, kept);
      }
      for (const auto& c : covered)
        for (int times : c)
          EXPECT_EQ(times, 1) << "limit " << limit << ", " << size;
      // Each bucket splits evenly: members differ by at most one element
      // per bucket.
      EXPECT_LE(kept_max - kept_min,
                static_cast<std::int64_t>(cut_buckets(numels, limit).size()));
    }
}

} // namespace
} // namespace h2::runtime
