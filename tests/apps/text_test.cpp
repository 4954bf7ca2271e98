// Real text (docs/data.md): h2-data turns fortunes into shards and back,
// h2-launch trains a llama on them, h2-generate continues a prompt from its
// checkpoint, and every way shards cannot serve a job
// (a damaged shard, a vocabulary larger than the model's, a window longer
// than a shard) is one line naming the file or the key, exit 2, before any
// step; h2-data's own bad input likewise.
#include "launch.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace h2::test {
namespace {

namespace fs = std::filesystem;

const std::string data_binary = H2_DATA;
const std::string generate_binary = H2_GENERATE;

/// Three fortune files: 80 KB of English.
const std::vector<std::string> texts = {"/usr/share/games/fortunes/food",
                                        "/usr/share/games/fortunes/kids",
                                        "/usr/share/games/fortunes/love"};

/// A llama of 4 blocks on two emulated chips of two vendors over `shards`.
std::string text_job(const fs::path& shards, int vocab_size, int seq_len) {
  return R"([model]
family = "llama"
vocab_size = )" +
         std::to_string(vocab_size) + R"(
seq_len = )" +
         std::to_string(seq_len) + R"(
d_model = 32
n_head = 4
n_kv_head = 2
n_layer = 4
[data]
source = "shards"
shards = ")" +
         shards.string() + R"("
[train]
steps = 2
global_batch = 4
micro_batch = 2
[emulation]
clock = "virtual"
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi300x"]
)";
}

class apps_text : public ::testing::Test {
protected:
  run_result data(std::vector<std::string> args,
                  const fs::path& in = "/dev/null") {
    return run_to_end(data_binary, args, dir_, run_timeout, in);
  }

  /// Tokenizes `texts` into dir_/name with a 512-piece tokenizer.
  fs::path tokenize(const std::string& name) {
    std::vector<std::string> args{"tokenize", "--vocab-size",
                                  "512",      "-q",
                                  "--out",    (dir_.path() / name).string(),
                                  "--input"};
    args.insert(args.end(), texts.begin(), texts.end());
    const auto r = data(args);
    EXPECT_TRUE(r.status.exited && r.status.code == 0)
      << r.status.describe() << "\n"
      << r.err;
    EXPECT_NE(r.out.find("h2-data: 3 files"), std::string::npos) << r.out;
    return dir_.path() / name;
  }

  /// h2-launch of text_job: exit 2, one line naming `needle`, no step.
  void expect_refused(const fs::path& shards, int vocab, int seq_len,
                      const std::string& needle) {
    SCOPED_TRACE(needle);
    const auto job = dir_.write("job.toml", text_job(shards, vocab, seq_len));
    const auto r = run_to_end(launch_binary, {job.string(), "--no-metrics"},
                              dir_, run_timeout);
    EXPECT_TRUE(r.status.exited && r.status.code == 2)
      << r.status.describe() << "\n"
      << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("step 1"), std::string::npos) << r.out;
  }

  scratch_dir dir_;
};

TEST_F(apps_text, tokenize_inspect_encode_decode_and_train) {
  const auto shards = tokenize("shards");
  auto r = data({"inspect", shards.string(), "--windows", "1"});
  EXPECT_TRUE(r.status.exited && r.status.code == 0) << r.err;
  EXPECT_NE(r.out.find("every CRC32C checked"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/usr/share/games/fortunes/kids"), std::string::npos);
  // encode then decode gives the text back.
  const auto text = dir_.write("text.txt", "Über  lunch\tat 12:30?\n");
  const auto model = (shards / "tokenizer.model").string();
  r = data({"encode", "--tokenizer", model}, text);
  ASSERT_TRUE(r.status.exited && r.status.code == 0) << r.err;
  const auto ids = dir_.write("ids.txt", r.out);
  r = data({"decode", "--tokenizer", model}, ids);
  EXPECT_EQ(r.out, "Über  lunch\tat 12:30?\n");
  // Two steps of a llama on them, saved.
  const auto ckpt = dir_.path() / "ckpt";
  const auto job =
    dir_.write("job.toml", text_job(shards, 512, 32) +
                             "[checkpoint]\ndir = \"" + ckpt.string() + "\"\n");
  r = run_to_end(launch_binary, {job.string(), "--no-metrics"}, dir_,
                 run_timeout);
  EXPECT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\n"
    << r.err;
  // h2-generate: the prompt, then a continuation the seed fixes, through
  // the job's own tokenizer.
  const std::vector<std::string> gen{(ckpt / "step-00000002").string(),
                                     "--prompt",
                                     "Food is",
                                     "--tokens",
                                     "20",
                                     "--seed",
                                     "3"};
  const auto a = run_to_end(generate_binary, gen, dir_, run_timeout);
  ASSERT_TRUE(a.status.exited && a.status.code == 0) << a.err;
  EXPECT_EQ(a.out.rfind("Food is", 0), 0u) << a.out;
  EXPECT_GT(a.out.size(), std::string("Food is\n").size());
  EXPECT_EQ(run_to_end(generate_binary, gen, dir_, run_timeout).out, a.out);
  // Without the tokenizer the checkpoint recorded: one line, exit 2.
  std::ofstream(shards / "tokenizer.model", std::ios::app) << "x";
  const auto bad = run_to_end(generate_binary, gen, dir_, run_timeout);
  EXPECT_TRUE(bad.status.exited && bad.status.code == 2) << bad.err;
  EXPECT_NE(bad.err.find("is not the tokenizer the checkpoint recorded"),
            std::string::npos)
    << bad.err;
}

TEST_F(apps_text, shards_that_cannot_serve_the_job_are_refused) {
  const auto shards = tokenize("shards");
  expect_refused(shards, 400, 32,
                 "model.vocab_size: 400 is smaller than the "
                 "512 ids of the tokenizer");
  expect_refused(shards, 512, 1 << 16, "shard-00000.bin holds");
  {
    std::fstream f(shards / "shard-00000.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(400);
    f.put('\x01');
  }
  expect_refused(shards, 512, 32, "shard-00000.bin: damaged");
}

TEST_F(apps_text, bad_input_to_h2_data_is_one_line) {
  const auto latin1 = dir_.write("latin1.txt", "caf\xe9\n");
  const auto out = dir_.path() / "out";
  auto expect_bad = [&](std::vector<std::string> args,
                        const std::string& needle) {
    SCOPED_TRACE(needle);
    if (args[0] == "tokenize")
      args.push_back("-q"); // stderr: the error alone
    const auto r = data(args);
    EXPECT_TRUE(r.status.exited && r.status.code == 2)
      << r.status.describe() << "\n"
      << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  };
  expect_bad({"tokenize", "--input", latin1.string(), "--vocab-size", "300",
              "--out", out.string()},
             "latin1.txt:1: not UTF-8 text");
  expect_bad({"tokenize", "--input", texts[0], "--out", out.string()},
             "--vocab-size: required");
  expect_bad({"tokenize", "--input", "/nonexistent", "--vocab-size", "300",
              "--out", out.string()},
             "/nonexistent: no such file");
  expect_bad({"tokenize", "--input", texts[0], "--vocab-size", "300", "--out",
              dir_.path().string()},
             "not empty");
  expect_bad({"tokenize", "--input", texts[0], "--vocab-size", "100000",
              "--out", out.string()},
             "Vocabulary size too high");
  expect_bad({"inspect", out.string()}, "no shard manifest");
}

} // namespace
} // namespace h2::test
