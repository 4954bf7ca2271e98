// Token shards (docs/data.md): a directory of uint32 little-endian token
// files, the tokenizer that made them, and manifest.json describing both.
// h2-data tokenize writes them (shard_writer), `[data] source = "shards"`
// trains on them (model::shard_source). No SentencePiece here: processes
// that link libtorch read shards (tokenizer.hpp says why they cannot
// tokenize).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace h2::corpus {

/// manifest.json of a shard directory.
inline constexpr const char* shard_manifest_file = "manifest.json";
/// The tokenizer h2-data copies beside the shards.
inline constexpr const char* shard_tokenizer_file = "tokenizer.model";

/// One shard: `tokens` uint32 ids, `tokens * 4` bytes.
struct shard_info {
  std::string file; ///< relative to the directory
  std::uint64_t tokens = 0;
  std::uint32_t crc32c = 0; ///< of the whole file
};

/// One input h2-data read.
struct shard_source_file {
  std::string path;
  std::uint64_t bytes = 0;
  std::uint64_t tokens = 0; ///< its share, the end-of-document id included
};

struct shard_manifest {
  std::string tokenizer_file = shard_tokenizer_file;
  std::string tokenizer_hash; ///< "sha256:<hex>" of the tokenizer file
  std::string tokenizer_type; ///< "bpe", "unigram", or "given"
  int vocab_size = 0;         ///< every id is below this
  int eos_id = -1;            ///< after each input file; -1: none
  std::vector<shard_info> shards;
  std::vector<shard_source_file> sources;

  std::uint64_t tokens() const noexcept;
};

/// Windows of seq_len + 1 tokens at a stride of seq_len in shards of these
/// sizes: the sum of floor((tokens - 1) / seq_len) (docs/data.md, "Order").
std::uint64_t window_count(const shard_manifest& m, int seq_len) noexcept;

/// The validation windows of `windows` at `val_fraction`:
/// max(1, floor(windows x val_fraction)); the rest train.
std::uint64_t validation_windows(std::uint64_t windows,
                                 double val_fraction) noexcept;

/// "sha256:<hex>" of `bytes`: a tokenizer's identity.
std::string sha256_of(std::string_view bytes);

/// sha256_of the bytes of the file `path`; nullopt when it cannot be read.
std::optional<std::string> file_sha256(const std::filesystem::path& path);

/// The manifest as JSON text (format "h2-shards", version 1).
std::string to_json(const shard_manifest& m);

/// Reads DIR/manifest.json. Throws config_error naming `key` and the file
/// when it is missing, not JSON, not an h2-shards manifest, or names a
/// shard outside the directory.
shard_manifest read_shard_manifest(const std::filesystem::path& dir,
                                   const std::string& key);

/// Writes tokens into shards of at most `shard_tokens` tokens
/// (shard-00000.bin, ...), streaming: at most one shard's buffer of 1 MiB
/// is in memory. Throws h2::error when a file cannot be written.
class shard_writer {
public:
  shard_writer(std::filesystem::path dir, std::uint64_t shard_tokens);
  ~shard_writer();
  shard_writer(const shard_writer&) = delete;
  shard_writer& operator=(const shard_writer&) = delete;

  void write(std::span<const std::uint32_t> tokens);
  /// Closes the last shard; returns every shard written.
  std::vector<shard_info> finish();

private:
  void open_next();
  void flush();

  std::filesystem::path dir_;
  std::uint64_t shard_tokens_;
  std::vector<std::uint32_t> buffer_;
  std::vector<shard_info> shards_;
  int fd_ = -1;
};

/// A shard directory opened for reading: every shard mapped and checked
/// against the manifest (size, CRC32C, ids below vocab_size).
class mapped_shards {
public:
  /// Throws config_error naming `key` and the file on any mismatch: a
  /// missing or resized shard, a CRC32C that differs ("damaged"), a
  /// tokenizer file whose hash is not the manifest's.
  mapped_shards(const std::filesystem::path& dir, const std::string& key);
  ~mapped_shards();
  mapped_shards(const mapped_shards&) = delete;
  mapped_shards& operator=(const mapped_shards&) = delete;

  const shard_manifest& manifest() const noexcept { return manifest_; }
  /// The tokens of shard `i`.
  std::span<const std::uint32_t> shard(std::size_t i) const;
  std::size_t size() const noexcept { return maps_.size(); }
  const std::filesystem::path& dir() const noexcept { return dir_; }

private:
  struct map {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  std::filesystem::path dir_;
  shard_manifest manifest_;
  std::vector<map> maps_;
};

} // namespace h2::corpus
