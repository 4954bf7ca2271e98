#include "h2/model/data.hpp"

#include "h2/core/error.hpp"
#include "h2/core/files.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace h2::model {
namespace {

double entropy(const std::vector<double>& p) {
  double h = 0;
  for (double x : p)
    if (x > 0)
      h -= x * std::log(x);
  return h;
}

// ---------------------------------------------------------------------------
// markov_source

constexpr int vocab = 9; // 8 states + BOS
constexpr int seq_len = 64;
constexpr double rate = 1.3;

TEST(model_markov, rows_have_the_entropy_rate) {
  markov_source src(vocab, seq_len, rate, 5);
  EXPECT_EQ(src.states(), 8);
  EXPECT_EQ(src.bos(), 8);
  EXPECT_EQ(src.entropy_rate(), rate);
  for (int r = 0; r < src.states(); ++r) {
    auto row = src.transition_row(r);
    ASSERT_EQ(row.size(), 8u);
    EXPECT_NEAR(entropy(row), rate, 1e-9) << r;
    EXPECT_NEAR(std::accumulate(row.begin(), row.end(), 0.0), 1.0, 1e-12);
    for (double p : row)
      EXPECT_GT(p, 0.0) << r;
  }
}

TEST(model_markov, stationary_distribution) {
  markov_source src(vocab, seq_len, rate, 5);
  const auto& pi = src.stationary();
  ASSERT_EQ(pi.size(), 8u);
  EXPECT_NEAR(std::accumulate(pi.begin(), pi.end(), 0.0), 1.0, 1e-12);
  std::vector<std::vector<double>> rows;
  for (int r = 0; r < 8; ++r)
    rows.push_back(src.transition_row(r));
  for (int c = 0; c < 8; ++c) {
    double next = 0;
    for (int r = 0; r < 8; ++r)
      next += pi[r] * rows[r][c];
    EXPECT_NEAR(next, pi[c], 1e-12) << c;
    EXPECT_GT(pi[c], 0.0);
  }
  EXPECT_NEAR(src.stationary_entropy(), entropy(pi), 1e-15);
  EXPECT_LE(src.stationary_entropy(), std::log(8.0) + 1e-12);
}

TEST(model_markov, achievable_loss) {
  markov_source src(vocab, seq_len, rate, 5);
  const double t = seq_len;
  EXPECT_NEAR(src.achievable_loss(),
              ((t - 1) * rate + entropy(src.stationary())) / t, 1e-12);
  // The first target costs H(pi) > H: the bound lies above the rate.
  EXPECT_GT(src.achievable_loss(), rate);
}

TEST(model_markov, sequences_are_documents_with_shifted_targets) {
  markov_source src(vocab, seq_len, rate, 5);
  EXPECT_EQ(src.seq_len(), seq_len);
  micro_batch mb = src.batch(split::train, 3, 0, 4, 0.25);
  EXPECT_EQ(mb.loss_scale, 0.25);
  ASSERT_EQ(mb.tokens.sizes(), (at::IntArrayRef{4, seq_len}));
  ASSERT_EQ(mb.targets.sizes(), (at::IntArrayRef{4, seq_len}));
  EXPECT_EQ(mb.tokens.scalar_type(), at::kLong);
  EXPECT_EQ(mb.targets.scalar_type(), at::kLong);
  auto in = mb.tokens.accessor<std::int64_t, 2>();
  auto out = mb.targets.accessor<std::int64_t, 2>();
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(in[s][0], src.bos());
    for (int i = 0; i < seq_len; ++i) {
      EXPECT_GE(out[s][i], 0);
      EXPECT_LT(out[s][i], src.states()); // never BOS
      if (i + 1 < seq_len) {
        EXPECT_EQ(in[s][i + 1], out[s][i]) << s << " " << i;
      }
    }
  }
}

TEST(model_markov, sequences_are_deterministic_and_stateless) {
  markov_source src(vocab, seq_len, rate, 5);
  markov_source same(vocab, seq_len, rate, 5);
  micro_batch a = src.batch(split::train, 7, 0, 4, 1);
  micro_batch b = same.batch(split::train, 7, 0, 4, 1);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  EXPECT_TRUE(at::equal(a.targets, b.targets));
  // Sequence 2 alone is row 2 of the micro-batch that held it.
  micro_batch one = src.batch(split::train, 7, 2, 1, 1);
  EXPECT_TRUE(at::equal(one.tokens[0], a.tokens[2]));
  EXPECT_TRUE(at::equal(one.targets[0], a.targets[2]));
  // Other split, batch, index or seed: other tokens.
  micro_batch val = src.batch(split::validation, 7, 0, 4, 1);
  EXPECT_FALSE(at::equal(val.targets, a.targets));
  micro_batch next = src.batch(split::train, 8, 0, 4, 1);
  EXPECT_FALSE(at::equal(next.targets, a.targets));
  EXPECT_FALSE(at::equal(a.targets[0], a.targets[1]));
  markov_source other(vocab, seq_len, rate, 6);
  EXPECT_FALSE(
    at::equal(other.batch(split::train, 7, 0, 4, 1).targets, a.targets));
}

TEST(model_markov, empirical_transitions_match_the_rows) {
  markov_source src(vocab, seq_len, rate, 5);
  const int n = src.states();
  std::vector<double> counts(n * n, 0), from(n, 0), first(n, 0);
  const int batches = 100, per_batch = 40; // 4000 sequences, 252k steps
  for (int b = 0; b < batches; ++b) {
    micro_batch mb = src.batch(split::train, b, 0, per_batch, 1);
    auto y = mb.targets.accessor<std::int64_t, 2>();
    for (int s = 0; s < per_batch; ++s) {
      first[y[s][0]] += 1;
      for (int i = 0; i + 1 < seq_len; ++i) {
        counts[y[s][i] * n + y[s][i + 1]] += 1;
        from[y[s][i]] += 1;
      }
    }
  }
  // Each frequency within 6 standard errors of its probability: a failure
  // by chance has odds of about 1e-7 over the 64 + 8 cells.
  for (int r = 0; r < n; ++r) {
    auto row = src.transition_row(r);
    ASSERT_GT(from[r], 1000) << r;
    for (int c = 0; c < n; ++c) {
      double p = row[c];
      double f = counts[r * n + c] / from[r];
      double se = std::sqrt(p * (1 - p) / from[r]);
      EXPECT_NEAR(f, p, 6 * se + 1e-12) << r << " -> " << c;
    }
  }
  // The first token of each document is drawn from pi.
  const double docs = batches * per_batch;
  for (int c = 0; c < n; ++c) {
    double p = src.stationary()[c];
    EXPECT_NEAR(first[c] / docs, p, 6 * std::sqrt(p * (1 - p) / docs)) << c;
  }
}

TEST(model_markov, made_from_a_job) {
  job_config job = parse_job(R"(
[job]
seed = 5
[model]
vocab_size = 9
seq_len = 64
d_model = 8
n_head = 2
n_layer = 1
[data]
entropy_rate = 1.3
[train]
global_batch = 4
[[nodes]]
chips = ["cpu"]
)",
                             "t");
  auto src = make_data_source(job);
  auto* m = dynamic_cast<markov_source*>(src.get());
  ASSERT_NE(m, nullptr);
  markov_source direct(vocab, seq_len, rate, 5);
  EXPECT_TRUE(at::equal(m->batch(split::train, 0, 0, 2, 1).tokens,
                        direct.batch(split::train, 0, 0, 2, 1).tokens));
}

// ---------------------------------------------------------------------------
// token_file_source

class model_token_file : public ::testing::Test {
protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/h2-model-data-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { h2::remove_tree(dir_); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  /// Writes raw bytes.
  std::string write_bytes(const std::string& name, const void* data,
                          std::size_t n) {
    std::ofstream out(path(name), std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
    EXPECT_TRUE(out.good());
    return path(name);
  }

  /// Writes nanoGPT's layout: raw little-endian uint16.
  std::string write_raw(const std::string& name,
                        const std::vector<std::uint16_t>& tokens) {
    return write_bytes(name, tokens.data(), tokens.size() * 2);
  }

  std::string write_llmc(const std::string& name,
                         const std::vector<std::uint16_t>& tokens) {
    write_llmc_tokens(path(name), tokens);
    return path(name);
  }

  std::string dir_;
};

/// Pseudo-random tokens below `vocab_size`: every window of a few tokens
/// occurs once, so a window identifies its offset.
std::vector<std::uint16_t> token_stream(std::size_t n, int vocab_size,
                                        std::uint32_t seed) {
  std::vector<std::uint16_t> out(n);
  std::uint32_t x = seed;
  for (auto& t : out) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<std::uint16_t>((x >> 16) % vocab_size);
  }
  return out;
}

data_config tokens_config(const std::string& train, const std::string& val,
                          double val_fraction = 0.1) {
  data_config d;
  d.source = source_kind::tokens;
  d.train_path = train;
  d.val_path = val;
  d.val_fraction = val_fraction;
  return d;
}

constexpr int file_vocab = 50;
constexpr int window_len = 8;

/// Every sequence of `mb` is a contiguous slice of `file` starting in
/// [lo, hi]: inputs file[o, o + T), targets file[o + 1, o + T + 1).
void expect_windows_from(const micro_batch& mb,
                         const std::vector<std::uint16_t>& file, std::size_t lo,
                         std::size_t hi) {
  const int t = static_cast<int>(mb.tokens.size(1));
  auto in = mb.tokens.accessor<std::int64_t, 2>();
  auto out = mb.targets.accessor<std::int64_t, 2>();
  for (int s = 0; s < mb.tokens.size(0); ++s) {
    for (int i = 0; i + 1 < t; ++i)
      ASSERT_EQ(in[s][i + 1], out[s][i]);
    bool found = false;
    for (std::size_t o = lo; o <= hi && !found; ++o) {
      bool match = true;
      for (int i = 0; i < t && match; ++i)
        match = in[s][i] == file[o + i] && out[s][i] == file[o + i + 1];
      found = match;
    }
    EXPECT_TRUE(found) << "sequence " << s << " is no window of the file "
                       << "starting in [" << lo << ", " << hi << "]";
  }
}

TEST_F(model_token_file, nanogpt_layout_with_validation_tail) {
  auto tokens = token_stream(1000, file_vocab, 1);
  token_file_source src(tokens_config(write_raw("train.bin", tokens), ""),
                        window_len, file_vocab, 3);
  EXPECT_EQ(src.train_layout(), token_file_source::layout::nanogpt);
  EXPECT_EQ(src.tokens(split::train), 900u);
  EXPECT_EQ(src.tokens(split::validation), 100u);
  for (int b = 0; b < 5; ++b) {
    // Training windows lie inside the first 900 tokens, validation windows
    // inside the last 100.
    expect_windows_from(src.batch(split::train, b, 0, 8, 1), tokens, 0,
                        900 - window_len - 1);
    expect_windows_from(src.batch(split::validation, b, 0, 8, 1), tokens, 900,
                        1000 - window_len - 1);
  }
  // Deterministic, stateless.
  EXPECT_TRUE(at::equal(src.batch(split::train, 2, 3, 1, 1).tokens[0],
                        src.batch(split::train, 2, 0, 4, 1).tokens[3]));
}

TEST_F(model_token_file, llmc_layout_and_separate_validation_file) {
  auto train = token_stream(600, file_vocab, 2);
  auto val = token_stream(50, file_vocab, 3);
  token_file_source src(
    tokens_config(write_llmc("train.bin", train), write_llmc("val.bin", val)),
    window_len, file_vocab, 4);
  EXPECT_EQ(src.train_layout(), token_file_source::layout::llmc);
  EXPECT_EQ(src.tokens(split::train), 600u);
  EXPECT_EQ(src.tokens(split::validation), 50u);
  for (int b = 0; b < 5; ++b) {
    expect_windows_from(src.batch(split::train, b, 0, 8, 1), train, 0,
                        600 - window_len - 1);
    expect_windows_from(src.batch(split::validation, b, 0, 8, 1), val, 0,
                        50 - window_len - 1);
  }
}

TEST_F(model_token_file, llmc_file_layout_on_disk) {
  std::vector<std::uint16_t> tokens = {1, 2, 65535};
  auto p = write_llmc("x.bin", tokens);
  EXPECT_EQ(std::filesystem::file_size(p), 1024u + 6u);
  std::ifstream in(p, std::ios::binary);
  std::int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
  std::uint16_t back[3];
  in.read(reinterpret_cast<char*>(back), sizeof(back));
  EXPECT_EQ(back[2], 65535);
}

TEST_F(model_token_file, window_of_exactly_seq_len_plus_one) {
  std::vector<std::uint16_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<std::uint16_t> val = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  token_file_source src(
    tokens_config(write_raw("t.bin", tokens), write_raw("v.bin", val)),
    window_len, 10, 0);
  micro_batch mb = src.batch(split::train, 0, 0, 3, 1);
  for (int s = 0; s < 3; ++s) {
    EXPECT_TRUE(at::equal(mb.tokens[s], at::arange(1, 9, at::kLong)));
    EXPECT_TRUE(at::equal(mb.targets[s], at::arange(2, 10, at::kLong)));
  }
}

/// Constructing the source must throw config_error at `key` with `needle`.
void expect_data_error(const data_config& d, int vocab_size,
                       const std::string& key, const std::string& needle) {
  try {
    token_file_source src(d, window_len, vocab_size, 0);
    ADD_FAILURE() << "accepted; expected an error at " << key;
  } catch (const config_error& e) {
    EXPECT_EQ(e.key_path(), key) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
      << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

TEST_F(model_token_file, missing_files) {
  auto good = write_raw("good.bin", token_stream(200, file_vocab, 1));
  expect_data_error(tokens_config(path("nope.bin"), ""), file_vocab,
                    "data.train", path("nope.bin"));
  expect_data_error(tokens_config(path("nope.bin"), ""), file_vocab,
                    "data.train", "cannot open");
  expect_data_error(tokens_config(good, path("nope-val.bin")), file_vocab,
                    "data.val", "nope-val.bin");
  expect_data_error(tokens_config(dir_, ""), file_vocab, "data.train",
                    "not a regular file");
}

TEST_F(model_token_file, malformed_files) {
  auto good = write_raw("good.bin", token_stream(200, file_vocab, 1));
  std::vector<unsigned char> odd(201, 1);
  expect_data_error(
    tokens_config(write_bytes("odd.bin", odd.data(), odd.size()), ""),
    file_vocab, "data.train", "odd size");
  expect_data_error(tokens_config(write_bytes("empty.bin", "", 0), ""),
                    file_vocab, "data.train", "too short");

  // llm.c: a header whose count disagrees with the file.
  std::vector<std::int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = 100;
  std::vector<unsigned char> bytes(1024 + 2 * 90, 0);
  std::memcpy(bytes.data(), header.data(), 1024);
  expect_data_error(
    tokens_config(write_bytes("count.bin", bytes.data(), bytes.size()), ""),
    file_vocab, "data.train", "header says 100 tokens but the file holds 90");
  // llm.c: another version.
  header[1] = 2;
  header[2] = 90;
  std::memcpy(bytes.data(), header.data(), 1024);
  expect_data_error(
    tokens_config(good, write_bytes("version.bin", bytes.data(), bytes.size())),
    file_vocab, "data.val", "version 2");
  // llm.c: a truncated header.
  expect_data_error(
    tokens_config(write_bytes("short.bin", bytes.data(), 512), ""), file_vocab,
    "data.train", "truncated");
}

TEST_F(model_token_file, token_ids_beyond_the_vocabulary) {
  auto tokens = token_stream(200, file_vocab, 1);
  tokens[17] = file_vocab;
  auto bad = write_raw("bad.bin", tokens);
  expect_data_error(tokens_config(bad, ""), file_vocab, "data.train",
                    "token id 50 at position 17");
  auto good = write_llmc("good.bin", token_stream(200, file_vocab, 2));
  expect_data_error(tokens_config(good, write_llmc("bad-val.bin", tokens)),
                    file_vocab, "data.val", ">= model.vocab_size = 50");
  // The same file is fine for a larger vocabulary.
  token_file_source ok(tokens_config(bad, ""), window_len, file_vocab + 1, 0);
  EXPECT_EQ(ok.tokens(split::train) + ok.tokens(split::validation), 200u);
}

TEST_F(model_token_file, too_few_tokens_for_seq_len) {
  auto tiny = write_raw("tiny.bin", {1, 2, 3, 4, 5});
  auto good = write_raw("good.bin", token_stream(200, file_vocab, 1));
  expect_data_error(tokens_config(tiny, ""), file_vocab, "data.train",
                    "needs at least 9");
  expect_data_error(tokens_config(good, tiny), file_vocab, "data.val",
                    "leaves 5 validation tokens");
  // A hold-out too small for one window names the fraction that made it.
  expect_data_error(tokens_config(good, "", 0.04), file_vocab,
                    "data.val_fraction", "leaves 8 validation tokens");
}

TEST_F(model_token_file, made_from_a_job) {
  auto tokens = token_stream(400, file_vocab, 9);
  auto train = write_llmc("train.bin", tokens);
  job_config job = parse_job(R"(
[model]
vocab_size = 50
seq_len = 8
d_model = 8
n_head = 2
n_layer = 1
[data]
source = "tokens"
train = ")" + train + R"("
val_fraction = 0.25
[train]
global_batch = 4
[[nodes]]
chips = ["cpu"]
)",
                             "t");
  auto src = make_data_source(job);
  auto* f = dynamic_cast<token_file_source*>(src.get());
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->train_layout(), token_file_source::layout::llmc);
  EXPECT_EQ(f->tokens(split::train), 300u);
  EXPECT_EQ(f->tokens(split::validation), 100u);
}

} // namespace
} // namespace h2::model
