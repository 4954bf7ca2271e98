// The tokenizer and the encoding of text into shards (corpus/tokenizer.hpp,
// corpus/encode.hpp), on the corpus every machine has (Debian's fortunes):
// decode(encode(text)) is the text, byte fallback covers characters the
// vocabulary lacks, both model types train, and text that is not UTF-8 is
// refused naming the file and the line.
#include "h2/corpus/encode.hpp"

#include "h2/core/error.hpp"
#include "h2/core/files.hpp"

#include "shard_fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace h2::corpus {
namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class corpus_tokenizer : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("h2-tokenizer-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
  }
  void TearDown() override { h2::remove_tree(dir_); }

  fs::path dir_;
};

TEST_F(corpus_tokenizer, the_corpus_round_trips_through_its_shards) {
  const auto inputs = test::fortune_files();
  ASSERT_GT(inputs.size(), 10u) << "make deps installs Debian's fortunes";
  tokenizer_training t;
  t.vocab_size = 1000;
  const auto tok =
    tokenizer::train(t, input_lines(inputs, "--input", {}), "--vocab-size");
  EXPECT_EQ(tok.vocab_size(), 1000);
  corpus_options o;
  o.inputs = inputs;
  o.out = dir_;
  o.shard_tokens = 200'000; // several shards
  o.tokenizer_type = "bpe";
  std::vector<std::string> phases;
  const auto m = encode_corpus(
    tok, o, [&](std::string_view phase, std::uint64_t, std::uint64_t) {
      if (phases.empty() || phases.back() != phase)
        phases.emplace_back(phase);
    });
  EXPECT_EQ(phases, std::vector<std::string>{"encoding"});
  EXPECT_GT(m.shards.size(), 1u);
  EXPECT_EQ(m.tokenizer_hash, tok.hash());
  EXPECT_EQ(m.sources.size(), inputs.size());
  // The shards, decoded file by file (each ends with EOS), are the files.
  mapped_shards s(dir_, "data.shards");
  std::vector<std::uint32_t> all;
  for (std::size_t i = 0; i < s.size(); ++i)
    all.insert(all.end(), s.shard(i).begin(), s.shard(i).end());
  ASSERT_EQ(all.size(), m.tokens());
  std::size_t at = 0;
  for (std::size_t f = 0; f < inputs.size(); ++f) {
    const auto n = static_cast<std::size_t>(m.sources[f].tokens);
    ASSERT_LE(at + n, all.size());
    EXPECT_EQ(all[at + n - 1], static_cast<std::uint32_t>(tok.eos_id()));
    EXPECT_TRUE(tok.decode({all.data() + at, n}) == read(inputs[f]))
      << inputs[f];
    at += n;
  }
  // The tokenizer on disk is the one that encoded.
  const auto again =
    tokenizer::load(dir_ / shard_tokenizer_file, "data.shards");
  EXPECT_EQ(again.hash(), tok.hash());
}

TEST_F(corpus_tokenizer, byte_fallback_and_both_model_types) {
  std::ofstream(dir_ / "text")
    << "the cat sat on the mat\nthe dog sat on the log\n"
       "a cat and a dog met at the mat and sat together\n";
  for (auto kind : {tokenizer_kind::bpe, tokenizer_kind::unigram}) {
    SCOPED_TRACE(std::string(to_string(kind)));
    tokenizer_training t;
    t.vocab_size = 278; // bytes, specials, characters, a few pieces
    t.kind = kind;
    const auto tok = tokenizer::train(
      t, input_lines({dir_ / "text"}, "--input", {}), "--vocab-size");
    // Characters the training text never had, tabs, runs of spaces,
    // leading spaces, Unicode beyond the BMP: all come back.
    const std::string text =
      "  The Über-cat\tsat  on 日本 🙂\n\nand left.\r\n";
    const auto ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text);
    EXPECT_NE(
      std::find_if(ids.begin(), ids.end(),
                   [&](auto id) { return tok.piece(id).starts_with("<0x"); }),
      ids.end())
      << "no byte piece";
  }
}

TEST_F(corpus_tokenizer, text_that_is_not_utf8_is_refused_by_file_and_line) {
  EXPECT_TRUE(valid_utf8("plain, ü, 日本, 🙂"));
  EXPECT_FALSE(valid_utf8("\xff"));
  EXPECT_FALSE(valid_utf8("\xc3"));             // truncated
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));         // overlong '/'
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));     // a surrogate
  EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80")); // above U+10FFFF
  std::ofstream(dir_ / "latin1") << "line one\nline two\ncaf\xe9\n";
  auto lines = input_lines({dir_ / "latin1"}, "--input", {});
  std::string line;
  try {
    while (lines(line)) {
    }
    FAIL() << "not refused";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("latin1:3: not UTF-8 text"),
              std::string::npos)
      << e.what();
  }
  EXPECT_THROW(input_bytes({dir_ / "missing"}, "--input"), config_error);
  EXPECT_THROW(input_bytes({dir_}, "--input"), config_error);
}

} // namespace
} // namespace h2::corpus
