// Token shards (corpus/shards.hpp): the writer cuts and checksums, the
// manifest round-trips, and a reader refuses a damaged, resized or foreign
// shard, naming the file.
#include "h2/corpus/shards.hpp"

#include "h2/core/crc32c.hpp"
#include "h2/core/error.hpp"
#include "h2/core/files.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace h2::corpus {
namespace {

namespace fs = std::filesystem;

class corpus_shards : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("h2-shards-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { h2::remove_tree(dir_); }

  /// `n` tokens 0, 1, ..., n-1 (mod 1000) in shards of `per_shard`, a
  /// tokenizer file of arbitrary bytes, and the manifest.
  shard_manifest write(std::uint64_t n, std::uint64_t per_shard) {
    shard_manifest m;
    const std::string tokenizer = "not a real tokenizer, but bytes to hash";
    std::ofstream(dir_ / shard_tokenizer_file) << tokenizer;
    m.tokenizer_hash = sha256_of(tokenizer);
    m.tokenizer_type = "given";
    m.vocab_size = 1000;
    shard_writer w(dir_, per_shard);
    std::vector<std::uint32_t> tokens;
    for (std::uint64_t i = 0; i < n; ++i)
      tokens.push_back(static_cast<std::uint32_t>(i % 1000));
    // In pieces of odd sizes: the writer's cuts are its own.
    for (std::size_t at = 0; at < tokens.size(); at += 37)
      w.write(std::span(tokens).subspan(
        at, std::min<std::size_t>(37, tokens.size() - at)));
    m.shards = w.finish();
    m.sources.push_back({"generated", n * 4, n});
    std::ofstream(dir_ / shard_manifest_file) << to_json(m);
    return m;
  }

  /// What opening dir_ says, or "" when it opens.
  std::string refusal() {
    try {
      mapped_shards s(dir_, "data.shards");
      return "";
    } catch (const config_error& e) {
      return e.what();
    }
  }

  fs::path dir_;
};

TEST_F(corpus_shards, writer_cuts_checksums_and_the_reader_maps) {
  const auto m = write(1000, 300);
  ASSERT_EQ(m.shards.size(), 4u); // 300 + 300 + 300 + 100
  EXPECT_EQ(m.shards[3].tokens, 100u);
  EXPECT_EQ(m.tokens(), 1000u);
  mapped_shards s(dir_, "data.shards");
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s.manifest().shards[1].file, "shard-00001.bin");
  for (std::size_t i = 0; i < 4; ++i) {
    const auto t = s.shard(i);
    EXPECT_EQ(t.size(), m.shards[i].tokens);
    EXPECT_EQ(t[0], i * 300);
    EXPECT_EQ(crc32c(t.data(), t.size_bytes()), m.shards[i].crc32c);
  }
  // The manifest reads back as written.
  const auto back = read_shard_manifest(dir_, "k");
  EXPECT_EQ(to_json(back), to_json(m));
  // Windows of seq_len + 1 at a stride of seq_len: floor(299 / 8) x 3 +
  // floor(99 / 8); the validation split's share.
  EXPECT_EQ(window_count(m, 8), 37u * 3 + 12u);
  EXPECT_EQ(validation_windows(123, 0.1), 12u);
  EXPECT_EQ(validation_windows(5, 0.1), 1u);
}

TEST_F(corpus_shards, a_damaged_resized_or_foreign_shard_is_refused) {
  write(1000, 300);
  ASSERT_EQ(refusal(), "");
  const auto shard = dir_ / "shard-00002.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(17);
    f.put('\x7f');
  }
  auto why = refusal();
  EXPECT_NE(why.find("data.shards: "), std::string::npos) << why;
  EXPECT_NE(why.find("shard-00002.bin: damaged"), std::string::npos) << why;

  write(1000, 300);
  fs::resize_file(shard, 400);
  why = refusal();
  EXPECT_NE(why.find("shard-00002.bin: 400 bytes, the manifest says 300"),
            std::string::npos)
    << why;

  write(1000, 300);
  std::ofstream(dir_ / shard_tokenizer_file) << "another tokenizer";
  why = refusal();
  EXPECT_NE(why.find("made by another tokenizer"), std::string::npos) << why;

  write(1000, 300);
  fs::remove(dir_ / shard_manifest_file);
  why = refusal();
  EXPECT_NE(why.find("no shard manifest"), std::string::npos) << why;
}

TEST_F(corpus_shards, a_manifest_cannot_name_files_outside_its_directory) {
  auto m = write(100, 100);
  m.shards[0].file = "../escape.bin";
  std::ofstream(dir_ / shard_manifest_file) << to_json(m);
  const auto why = refusal();
  EXPECT_NE(why.find("is not a file name in the directory"), std::string::npos)
    << why;
}

} // namespace
} // namespace h2::corpus
