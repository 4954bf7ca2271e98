#include "h2/transport/tags.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>

namespace h2::transport {
namespace {

constexpr std::int64_t max_step = (std::int64_t{1} << 26) - 1;
constexpr int max_chunk = max_tag_chunks - 1;
constexpr int max_micro_batch = (1 << 22) - 1;

TEST(transport_tags, round_trip) {
  const tag_kind kinds[] = {tag_kind::activation, tag_kind::gradient,
                            tag_kind::eval_activation, tag_kind::control};
  const std::int64_t steps[] = {
    0,       1,         255,       256,          65'535,
    1 << 20, 1LL << 24, 1LL << 25, max_step - 1, max_step};
  const int micro_batches[] = {0, 1, 3, 4095, 1 << 21, max_micro_batch};
  for (tag_kind k : kinds)
    for (std::int64_t s : steps)
      for (int mb : micro_batches)
        for (int c : {0, 1, 255, max_chunk}) {
          std::uint64_t tag = make_tag(k, s, mb, c);
          EXPECT_EQ(tag_kind_of(tag), k) << s << " " << mb;
          EXPECT_EQ(tag_step(tag), s) << s << " " << mb;
          EXPECT_EQ(tag_micro_batch(tag), mb) << s << " " << mb;
          EXPECT_EQ(tag_chunk(tag), c) << s << " " << mb;
        }
  // Steps wrap: only neighbouring steps are ever in flight together.
  EXPECT_EQ(tag_step(make_tag(tag_kind::activation, max_step + 1, 0)), 0);
}

TEST(transport_tags, distinct_fields_give_distinct_tags) {
  std::set<std::uint64_t> seen;
  int n = 0;
  for (auto k : {tag_kind::activation, tag_kind::gradient,
                 tag_kind::eval_activation, tag_kind::control})
    for (std::int64_t s : {std::int64_t{0}, std::int64_t{1}, max_step})
      for (int mb : {0, 1, max_micro_batch})
        for (int c : {0, 1, max_chunk}) {
          seen.insert(make_tag(k, s, mb, c));
          ++n;
        }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(n));
}

TEST(transport_tags, layout) {
  // 2 bits of kind, 22 of micro-batch, 14 of chunk, 26 of step (tags.hpp).
  EXPECT_EQ(make_tag(tag_kind::gradient, 0, 0), 1u);
  EXPECT_EQ(make_tag(tag_kind::activation, 0, 1), 4u);
  EXPECT_EQ(make_tag(tag_kind::activation, 0, 0, 1), std::uint64_t{1} << 24);
  EXPECT_EQ(make_tag(tag_kind::activation, 1, 0), std::uint64_t{1} << 38);
  EXPECT_EQ(make_tag(tag_kind::control, max_step, max_micro_batch, max_chunk),
            ~std::uint64_t{0});
  static_assert(tag_step(make_tag(tag_kind::control, 12345, 6)) == 12345);
}

} // namespace
} // namespace h2::transport
