// Text files to token shards (docs/data.md): what h2-data tokenize does,
// as functions its tests call directly. Inputs are read line by line and
// never held whole, so a corpus may be larger than memory.
#pragma once

#include "h2/corpus/shards.hpp"
#include "h2/corpus/tokenizer.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace h2::corpus {

/// Called as input bytes are consumed: `done` of `total` bytes in `phase`
/// ("training", "encoding").
using corpus_progress = std::function<void(
  std::string_view phase, std::uint64_t done, std::uint64_t total)>;

/// The bytes of every input: regular files, readable. Throws config_error
/// naming `key` and the file otherwise.
std::uint64_t input_bytes(const std::vector<std::filesystem::path>& inputs,
                          const std::string& key);

/// Every line of the inputs in order, without its line break, for training
/// a tokenizer. Lines that are not valid UTF-8 are config_error naming
/// `key`, the file and the line number. The source holds the inputs'
/// progress; keep it alive while the line_source is used.
line_source input_lines(const std::vector<std::filesystem::path>& inputs,
                        const std::string& key,
                        const corpus_progress& progress);

/// Whether `text` is valid UTF-8 (no overlong forms, no surrogates).
bool valid_utf8(std::string_view text) noexcept;

struct corpus_options {
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out; ///< an empty or new directory
  std::uint64_t shard_tokens = std::uint64_t{1} << 27; ///< 512 MiB shards
  std::string tokenizer_type; ///< "bpe", "unigram" or "given"
};

/// Encodes every input with `tok` into shards in `o.out` (each line's ids,
/// then the "\n" piece where the line had a break, then EOS after each
/// file), writes the tokenizer beside them and manifest.json last. Returns
/// the manifest. Throws config_error naming "--input" for invalid UTF-8,
/// h2::error when a file cannot be written.
shard_manifest encode_corpus(const tokenizer& tok, const corpus_options& o,
                             const corpus_progress& progress);

} // namespace h2::corpus
