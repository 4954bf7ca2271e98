// Text to token ids and back: a SentencePiece model (BPE or unigram), as
// Llama 2 and many others ship theirs (docs/data.md). libsentencepiece stays
// behind this header, in the library h2_tokenizer.
//
// Only processes without libtorch may link h2_tokenizer: Debian's
// libsentencepiece 0.1.97 carries its own protobuf-lite 3.14 and exports
// its symbols, and a process that also loads libprotobuf 3.21 (libtorch
// does) crashes while starting, whichever library's symbols win. h2-data is
// such a process; h2-generate runs `h2-data encode` and `h2-data decode`.
//
// The models h2-data trains are lossless: no normalisation, whitespace kept
// as written (no dummy prefix, runs of spaces allowed), "\n" a piece of its
// own, and byte fallback (<0x00>..<0xFF>) for every character outside the
// vocabulary, so decode(encode(text)) == text for any valid UTF-8 text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace h2::corpus {

enum class tokenizer_kind { bpe, unigram };

/// "bpe", "unigram".
std::string_view to_string(tokenizer_kind kind) noexcept;

/// How h2-data trains a tokenizer.
struct tokenizer_training {
  int vocab_size = 0;
  tokenizer_kind kind = tokenizer_kind::bpe;
  /// Lines the trainer keeps, sampled uniformly from all inputs (the rest
  /// are read but not kept): the trainer's memory bound.
  std::int64_t max_sentences = 2'000'000;
  int threads = 1;
};

/// Lines of training text, one at a time: false when there are no more.
using line_source = std::function<bool(std::string& line)>;

class tokenizer {
public:
  /// The model in `path` (a SentencePiece .model file). Throws
  /// config_error naming `key` and the file when it cannot be read or is
  /// not a SentencePiece model.
  static tokenizer load(const std::filesystem::path& path,
                        const std::string& key);

  /// Trains a lossless model (see above) on every line `lines` gives.
  /// Throws config_error naming `key` when SentencePiece refuses (e.g. a
  /// vocabulary larger than the text allows).
  static tokenizer train(const tokenizer_training& options,
                         const line_source& lines, const std::string& key);

  tokenizer(tokenizer&&) noexcept;
  tokenizer& operator=(tokenizer&&) noexcept;
  ~tokenizer();

  /// Appends the ids of `text` to `out`.
  void encode(std::string_view text, std::vector<std::uint32_t>& out) const;
  std::vector<std::uint32_t> encode(std::string_view text) const;

  /// The text of `ids` (ids outside the vocabulary are internal_error:
  /// callers check them). Control ids (BOS, EOS) decode to nothing.
  std::string decode(std::span<const std::uint32_t> ids) const;

  /// The piece of one id, as SentencePiece names it ("▁the", "<0x0A>").
  std::string piece(std::uint32_t id) const;

  int vocab_size() const;
  /// End of a document (appended after each input file); -1 if none.
  int eos_id() const;

  /// The serialized model, as a .model file holds it.
  const std::string& model_bytes() const noexcept { return bytes_; }
  /// "sha256:<hex>" of model_bytes(): the tokenizer's identity.
  std::string hash() const;

  /// SentencePiece's processor, opaque outside tokenizer.cpp.
  struct impl;

private:
  tokenizer(std::unique_ptr<impl> p, std::string bytes);

  std::unique_ptr<impl> impl_;
  std::string bytes_;
};

} // namespace h2::corpus
