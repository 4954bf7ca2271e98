// `[data] source = "shards"` (model/data.hpp, shard_source; docs/data.md,
// "Order"): windows in shard order, the validation tail, each epoch a
// permutation of the training windows keyed by the seed, and the errors a
// job gets for shards that cannot serve it.
#include "h2/model/data.hpp"

#include "h2/core/error.hpp"
#include "h2/core/files.hpp"

#include "shard_fixture.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>

namespace h2::model {
namespace {

namespace fs = std::filesystem;

TEST(model_shuffle, every_position_once_for_every_size_and_key) {
  for (std::uint64_t n : {1u, 2u, 3u, 17u, 64u, 1000u, 4097u})
    for (std::uint64_t key : {0ull, 7ull, 0xdeadbeefull}) {
      std::set<std::uint64_t> seen;
      for (std::uint64_t i = 0; i < n; ++i) {
        const auto p = shuffle_position(i, n, key);
        ASSERT_LT(p, n);
        seen.insert(p);
      }
      EXPECT_EQ(seen.size(), n) << "n " << n << " key " << key;
    }
  // Keys give other orders.
  int same = 0;
  for (std::uint64_t i = 0; i < 1000; ++i)
    same += shuffle_position(i, 1000, 1) == shuffle_position(i, 1000, 2);
  EXPECT_LT(same, 20);
}

class model_shards : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("h2-shard-source-" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { h2::remove_tree(dir_); }

  void write(const std::vector<std::uint64_t>& sizes) {
    test::write_test_shards(dir_, sizes, 50);
  }

  data_config config(double val_fraction = 0.1) const {
    data_config d;
    d.source = source_kind::shards;
    d.shards_dir = dir_.string();
    d.val_fraction = val_fraction;
    return d;
  }

  std::string refusal(int seq_len, int vocab) {
    try {
      shard_source s(config(), seq_len, vocab, 4, 1);
      return "";
    } catch (const config_error& e) {
      return e.what();
    }
  }

  fs::path dir_;
};

TEST_F(model_shards, windows_split_and_epochs) {
  write({41, 33, 81}); // windows of 9 at stride 8: 5 + 4 + 10 = 19
  const int t = 8, global_batch = 4;
  shard_source s(config(0.1), t, 50, global_batch, 3);
  EXPECT_EQ(s.windows(split::validation), 1u);
  EXPECT_EQ(s.windows(split::train), 18u);
  // Training: each epoch (18 sequences) reads every training window once.
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<std::uint64_t> seen;
    for (int k = epoch * 18; k < epoch * 18 + 18; ++k)
      seen.insert(
        s.window_of(split::train, k / global_batch, k % global_batch));
    EXPECT_EQ(seen.size(), 18u);
    EXPECT_EQ(*seen.rbegin(), 17u);
  }
  EXPECT_EQ(s.epoch_of(17), 0u);
  EXPECT_EQ(s.epoch_of(18), 1u);
  // Two epochs are ordered differently.
  bool differs = false;
  for (int k = 0; k < 18; ++k)
    differs |= s.window_of(split::train, k / 4, k % 4) !=
               s.window_of(split::train, (k + 18) / 4, (k + 18) % 4);
  EXPECT_TRUE(differs);
  // Validation: the last window, in order.
  EXPECT_EQ(s.window_of(split::validation, 0, 0), 18u);
  // A window's tokens are the shard's, targets shifted by one: window 6
  // is the second of shard 1 (the corpus's tokens 41 + 8 = 49 onwards).
  for (int k = 0; k < 36; ++k) {
    const auto mb = s.batch(split::train, k / 4, k % 4, 1, 1.0);
    const auto w = s.window_of(split::train, k / 4, k % 4);
    const std::int64_t start = w < 5   ? w * 8
                               : w < 9 ? 41 + (w - 5) * 8
                                       : 74 + (w - 9) * 8;
    auto token = [](std::int64_t i) {
      return (i * 7 + i / 5) % 50;
    };
    EXPECT_EQ(mb.tokens[0][0].item<std::int64_t>(), token(start))
      << "window " << w;
    EXPECT_EQ(mb.targets[0][0].item<std::int64_t>(), token(start + 1));
    EXPECT_EQ(mb.targets[0][7].item<std::int64_t>(), token(start + 8));
  }
}

TEST_F(model_shards, shards_that_cannot_serve_the_job_are_refused) {
  write({41, 33});
  auto why = refusal(8, 40); // the tokenizer's 50 ids do not fit 40
  EXPECT_NE(why.find("model.vocab_size: 40 is smaller than the 50 ids"),
            std::string::npos)
    << why;
  why = refusal(40, 50); // 41 + 33 tokens: shard 1 is shorter than 41
  EXPECT_NE(why.find("data.shards: "), std::string::npos) << why;
  EXPECT_NE(why.find("shard-1.bin holds 33 tokens, fewer than a window of "
                     "model.seq_len + 1 = 41"),
            std::string::npos)
    << why;
  EXPECT_EQ(refusal(8, 50), "");
  write({41});
  why = refusal(32, 50); // one window, held out: none left to train on
  EXPECT_NE(why.find("data.val_fraction: leaves no training window"),
            std::string::npos)
    << why;
}

} // namespace
} // namespace h2::model
