// h2-export (docs/export.md): the export of a checkpoint is byte for byte
// what h2-launch --export writes for the same weights, with the model's
// config beside it; a missing, foreign or damaged checkpoint and a bad
// --logits token file are one-line errors naming the file, exit 2, and
// write nothing. tests/python/test_export.py checks the logits against
// PyTorch.
#include "launch.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <vector>

namespace h2::test {
namespace {

const std::string export_binary = H2_EXPORT;

class apps_export : public ::testing::Test {
protected:
  /// Trains small_job for `steps` steps with [checkpoint] under the
  /// scratch directory (and `extra` flags); returns the last checkpoint.
  std::filesystem::path train(int steps, std::vector<std::string> extra = {}) {
    auto job = dir_.write(
      "job.toml",
      replaced(small_job, "steps = 20", "steps = " + std::to_string(steps)) +
        "\n[checkpoint]\ndir = \"" + (dir_ / "checkpoints").string() + "\"\n");
    std::vector<std::string> args = {job.string(), "-q", "--no-metrics"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_to_end(launch_binary, args, dir_, run_timeout);
    EXPECT_TRUE(r.status.exited && r.status.code == 0)
      << r.status.describe() << "\n"
      << r.err;
    char name[32];
    std::snprintf(name, sizeof name, "step-%08d", steps);
    return dir_ / "checkpoints" / name;
  }

  run_result h2_export(const std::vector<std::string>& args) {
    return run_to_end(export_binary, args, dir_, run_timeout);
  }

  /// Expects exit 2 with one line on stderr naming `file`, and no `out`.
  void expect_bad_input(const run_result& r, const std::string& file,
                        const std::filesystem::path& out) {
    EXPECT_TRUE(r.status.exited && r.status.code == 2) << r.status.describe();
    expect_one_line(r.err);
    EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out)) << out;
  }

  /// Writes int32 token ids to `name` in the scratch directory.
  std::filesystem::path tokens(const std::string& name,
                               const std::vector<std::int32_t>& ids) {
    const auto path = dir_ / name;
    std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * sizeof(ids[0])));
    return path;
  }

  scratch_dir dir_;
};

TEST_F(apps_export, the_export_is_what_launch_exports_plus_the_config) {
  const auto launched = dir_ / "launched.safetensors";
  const auto checkpoint = train(3, {"--export", launched.string()});
  const auto out = dir_ / "model.safetensors";
  auto r = h2_export({checkpoint.string(), out.string()});
  ASSERT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\n"
    << r.err;
  EXPECT_NE(r.out.find("model.config.json"), std::string::npos) << r.out;
  // The last checkpoint holds the final weights: the same file.
  EXPECT_EQ(read_text(out), read_text(launched));
  EXPECT_FALSE(read_text(out).empty());

  const auto config =
    nlohmann::json::parse(read_text(dir_ / "model.config.json"));
  EXPECT_EQ(config.at("step"), 3);
  EXPECT_EQ(config.at("job"), "e2e");
  EXPECT_EQ(config.at("weights"), "model.safetensors");
  EXPECT_EQ(config.at("vocab_size"), 17);
  EXPECT_EQ(config.at("seq_len"), 16);
  EXPECT_EQ(config.at("d_model"), 32);
  EXPECT_EQ(config.at("n_head"), 2);
  EXPECT_EQ(config.at("n_layer"), 4);
  EXPECT_EQ(config.at("d_ff"), 128); // 4 x d_model by default
  EXPECT_EQ(config.at("tied_embeddings"), false);
  EXPECT_EQ(config.at("dtype"), "float32");
}

TEST_F(apps_export, a_missing_or_foreign_directory_is_bad_input) {
  const auto out = dir_ / "model.safetensors";
  auto r = h2_export({(dir_ / "nowhere").string(), out.string()});
  expect_bad_input(r, (dir_ / "nowhere").string(), out);

  std::filesystem::create_directory(dir_ / "empty");
  r = h2_export({(dir_ / "empty").string(), out.string()});
  expect_bad_input(r, (dir_ / "empty" / "manifest.json").string(), out);

  dir_.write("manifest.json", "{\"format\": \"not-h2\"}");
  r = h2_export({dir_.path().string(), out.string()});
  expect_bad_input(r, (dir_ / "manifest.json").string(), out);

  r = h2_export({});
  EXPECT_TRUE(r.status.exited && r.status.code == 2) << r.status.describe();
  expect_one_line(r.err);
}

TEST_F(apps_export, a_damaged_layer_file_is_named) {
  const auto checkpoint = train(2);
  const auto out = dir_ / "model.safetensors";
  // checkpoint.dir instead of one of its checkpoints: the newest is named.
  auto r = h2_export({(dir_ / "checkpoints").string(), out.string()});
  expect_bad_input(r, (dir_ / "checkpoints" / "manifest.json").string(), out);
  EXPECT_NE(r.err.find(checkpoint.string()), std::string::npos) << r.err;

  const auto layer = checkpoint / "layer-00003.safetensors";
  ASSERT_TRUE(std::filesystem::exists(layer));
  {
    std::fstream f(layer, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    const char byte = static_cast<char>(f.get() ^ 0x5a);
    f.seekp(-5, std::ios::end);
    f.put(byte); // a changed byte in the data: its CRC no longer matches
  }
  expect_bad_input(h2_export({checkpoint.string(), out.string()}),
                   layer.string(), out);
  expect_bad_input(
    h2_export({checkpoint.string(), "--logits",
               tokens("ok.bin", std::vector<std::int32_t>(16)).string(),
               (dir_ / "logits.bin").string()}),
    layer.string(), dir_ / "logits.bin");
}

TEST_F(apps_export, logits_of_whole_sequences_and_bad_token_files) {
  const auto checkpoint = train(2);
  const auto out = dir_ / "logits.bin";
  // small_job: seq_len 16, vocab_size 17.
  std::vector<std::int32_t> ids(2 * 16);
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 7 + 3) % 17);
  auto r = h2_export({checkpoint.string(), "--logits",
                      tokens("ok.bin", ids).string(), out.string()});
  ASSERT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\n"
    << r.err;
  EXPECT_EQ(std::filesystem::file_size(out), 2u * 16 * 17 * sizeof(float));
  std::filesystem::remove(out);

  // Not whole sequences: 15 ids.
  auto bad = tokens("short.bin", std::vector<std::int32_t>(15));
  expect_bad_input(
    h2_export({checkpoint.string(), "--logits", bad.string(), out.string()}),
    bad.string(), out);
  // A token id outside the vocabulary.
  ids[20] = 17;
  bad = tokens("vocab.bin", ids);
  r = h2_export({checkpoint.string(), "--logits", bad.string(), out.string()});
  expect_bad_input(r, bad.string(), out);
  EXPECT_NE(r.err.find("token id 17"), std::string::npos) << r.err;
  // A negative one.
  ids[20] = -1;
  bad = tokens("negative.bin", ids);
  expect_bad_input(
    h2_export({checkpoint.string(), "--logits", bad.string(), out.string()}),
    bad.string(), out);
  // No such file.
  expect_bad_input(h2_export({checkpoint.string(), "--logits",
                              (dir_ / "none.bin").string(), out.string()}),
                   (dir_ / "none.bin").string(), out);
}

} // namespace
} // namespace h2::test
