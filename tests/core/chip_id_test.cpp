#include "h2/core/chip_id.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace h2 {
namespace {

TEST(core_chip_id, parses_node_and_index) {
  auto id = chip_id::parse("0:1");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->node, 0);
  EXPECT_EQ(id->index, 1);

  id = chip_id::parse("12:345");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(id->node, 12);
  EXPECT_EQ(id->index, 345);
}

TEST(core_chip_id, to_string_round_trips) {
  for (chip_id id :
       {chip_id{0, 0}, chip_id{0, 1}, chip_id{7, 3}, chip_id{1023, 65535}}) {
    std::string text = id.to_string();
    EXPECT_EQ(text, std::to_string(id.node) + ":" + std::to_string(id.index));
    auto back = chip_id::parse(text);
    ASSERT_TRUE(back.has_value()) << text;
    EXPECT_EQ(*back, id) << text;
  }
  EXPECT_EQ((chip_id{3, 14}).to_string(), "3:14");
}

TEST(core_chip_id, rejects_malformed_text) {
  const std::vector<std::string> bad = {
    "",      "1",     ":1",           "1:",   ":",    "a:b",  "-1:0", "0:-1",
    "1:2x",  "x1:2",  "1:2:3",        " 1:2", "1:2 ", "+1:2", "1::2", "1;2",
    "1.0:2", "0x1:2", "99999999999:0"};
  for (const auto& text : bad)
    EXPECT_FALSE(chip_id::parse(text).has_value()) << '"' << text << '"';
}

TEST(core_chip_id, orders_by_node_then_index) {
  EXPECT_LT((chip_id{0, 5}), (chip_id{1, 0}));
  EXPECT_LT((chip_id{1, 0}), (chip_id{1, 1}));
  EXPECT_EQ((chip_id{2, 3}), (chip_id{2, 3}));
  EXPECT_NE((chip_id{2, 3}), (chip_id{3, 2}));
}

TEST(core_chip_id, hash_separates_swapped_fields) {
  std::hash<chip_id> h;
  EXPECT_NE(h(chip_id{0, 1}), h(chip_id{1, 0}));
  EXPECT_EQ(h(chip_id{4, 2}), h(chip_id{4, 2}));
}

} // namespace
} // namespace h2
