// Token shards for tests (corpus/shards.hpp) without a tokenizer: a
// tokenizer file of fixed bytes, and shards of generated ids; and the text
// corpus every machine has (Debian's fortunes, make deps).
#pragma once

#include "h2/corpus/shards.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace h2::test {

/// Every text file of Debian's fortunes (not the .dat indexes or the .u8
/// links), in name order.
inline std::vector<std::filesystem::path> fortune_files() {
  std::vector<std::filesystem::path> out;
  for (const auto& e :
       std::filesystem::directory_iterator("/usr/share/games/fortunes"))
    if (e.is_regular_file() && !e.is_symlink() &&
        e.path().extension() != ".dat")
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// Writes shards of `sizes` tokens into `dir` (shard-0.bin, ...) whose
/// token i (counted over the whole corpus) is (i x 7 + i / 5) mod `vocab`,
/// a tokenizer file holding `tokenizer`, and the manifest.
inline corpus::shard_manifest
write_test_shards(const std::filesystem::path& dir,
                  const std::vector<std::uint64_t>& sizes, int vocab,
                  const std::string& tokenizer = "test tokenizer") {
  namespace fs = std::filesystem;
  corpus::shard_manifest m;
  std::ofstream(dir / corpus::shard_tokenizer_file) << tokenizer;
  m.tokenizer_hash = corpus::sha256_of(tokenizer);
  m.tokenizer_type = "given";
  m.vocab_size = vocab;
  std::uint64_t next = 0;
  for (auto n : sizes) {
    corpus::shard_writer w(dir, n);
    std::vector<std::uint32_t> t;
    for (std::uint64_t i = 0; i < n; ++i, ++next)
      t.push_back(static_cast<std::uint32_t>((next * 7 + next / 5) % vocab));
    w.write(t);
    auto s = w.finish();
    // One writer per shard: its only shard, renamed into sequence.
    const auto name = "shard-" + std::to_string(m.shards.size()) + ".bin";
    fs::rename(dir / s[0].file, dir / name);
    s[0].file = name;
    m.shards.push_back(s[0]);
  }
  std::ofstream(dir / corpus::shard_manifest_file) << corpus::to_json(m);
  return m;
}

} // namespace h2::test
