// Safetensors files (docs/checkpoints.md): the writer shared by checkpoints
// and the `--export` of weights, and a reader that treats every byte as
// hostile. Plain host memory and POSIX I/O; no actors, no torch.
#pragma once

#include "h2/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace h2::runtime {

/// What is wrong with a checkpoint file (docs/checkpoints.md, "Errors").
enum class checkpoint_errc {
  missing,   ///< the file does not exist
  truncated, ///< the file ends before what describes it says it should
  corrupt,   ///< CRC mismatch, bad JSON, bad offsets, unknown dtype, ...
  mismatch,  ///< well formed, but not what the manifest says (version, size)
  foreign,   ///< not written by H2 (manifest "format", safetensors producer)
  io,        ///< the operating system failed a call (disk full, permissions)
};

/// Name of a checkpoint error kind, e.g. "truncated".
std::string_view to_string(checkpoint_errc kind) noexcept;

/// A failure to read or write a checkpoint file (a layer's safetensors file
/// or the manifest), or to load a layer's state. what() is
/// "<file>: <kind>: <message>" ("<kind>: <message>" when `file` is empty).
class checkpoint_error : public error {
public:
  checkpoint_error(checkpoint_errc kind, std::filesystem::path file,
                   const std::string& message);

  checkpoint_errc kind() const noexcept { return kind_; }

  /// The offending file (or directory, for errors about one).
  const std::filesystem::path& file() const noexcept { return file_; }

private:
  checkpoint_errc kind_;
  std::filesystem::path file_;
};

/// Bytes per element of a safetensors dtype H2 writes: "F32" 4, "BF16" 2,
/// "F16" 2, "I64" 8. 0 for any other string.
std::size_t dtype_bytes(std::string_view dtype) noexcept;

/// Name, dtype and shape of a tensor: what a manifest records of it.
struct tensor_record {
  std::string name;
  std::string dtype; ///< a safetensors dtype, see dtype_bytes()
  std::vector<std::int64_t> shape;

  bool operator==(const tensor_record&) const = default;
};

/// A tensor in host memory, its elements little-endian and row-major.
/// Invariant (checked by the writer): bytes.size() == product(shape) *
/// dtype_bytes(dtype); a shape of {} is a scalar.
struct state_tensor {
  std::string name;  ///< "block3.attn.qkv.weight", "<param>.exp_avg", ...
  std::string dtype; ///< "F32", "BF16", "F16" or "I64"
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;

  bool operator==(const state_tensor&) const = default;
};

/// The training state of one global layer, what one layer file holds: its
/// parameters and, once the optimizer has stepped, their AdamW moments
/// "<param>.exp_avg" and "<param>.exp_avg_sq" (absent before the first
/// step).
struct layer_state {
  int layer = 0; ///< global layer index, 0-based
  std::vector<state_tensor> tensors;

  bool operator==(const layer_state&) const = default;
};

/// An F32 tensor holding a copy of `values` (whose size must match `shape`).
state_tensor f32_tensor(std::string name, std::vector<std::int64_t> shape,
                        std::span<const float> values);

/// Size and checksum of a file as written.
struct written_file {
  std::uint64_t bytes = 0;
  std::uint32_t crc32c = 0; ///< CRC32C (Castagnoli) of the whole file
};

/// Writes `tensors` to `path` (created or replaced) as safetensors: an 8-byte
/// little-endian header length, the JSON header (keys in sorted order, each
/// tensor's "dtype", "shape" and "data_offsets", and "__metadata__" holding
/// {"format": "pt", "producer": "h2"} plus `metadata`), padded with spaces to
/// a multiple of 8 bytes, then the tensors' bytes in the order given. The
/// file is fsynced before this returns. The same bytes as the `--export`
/// writer of weights for F32 tensors, given metadata {"job": name}.
/// Invalid tensors (size, dtype, duplicate or empty names) and metadata that
/// overrides "format" or "producer" are bugs: h2::internal_error. A failing
/// system call is a checkpoint_error of kind `io`.
written_file
write_safetensors(const std::filesystem::path& path,
                  std::span<const state_tensor> tensors,
                  const std::map<std::string, std::string>& metadata);

/// Largest JSON header the reader accepts, in bytes.
inline constexpr std::uint64_t max_safetensors_header_bytes = 100ull << 20;

/// Reads a safetensors file, checking sizes and offsets before allocating
/// anything: the header length (at most max_safetensors_header_bytes and
/// within the file), the JSON, each tensor's dtype, shape and data_offsets
/// (within the file, matching dtype * shape, covering the data exactly once
/// with no overlap and no gap). Any producer's file reads; callers check
/// metadata(). Not thread-safe; owns an open file descriptor.
class safetensors_reader {
public:
  /// Opens `path` and validates its header. With `expected_bytes` (a size
  /// the caller trusts, e.g. the manifest's), a shorter file is `truncated`,
  /// a longer one a `mismatch`, and a header that runs past the end of the
  /// file is `corrupt`; without it such a header means `truncated`.
  /// Throws checkpoint_error naming `path`.
  explicit safetensors_reader(
    std::filesystem::path path,
    std::optional<std::uint64_t> expected_bytes = std::nullopt);
  ~safetensors_reader();
  safetensors_reader(const safetensors_reader&) = delete;
  safetensors_reader& operator=(const safetensors_reader&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }
  std::uint64_t file_bytes() const noexcept { return file_bytes_; }

  /// The "__metadata__" entries (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const noexcept {
    return metadata_;
  }

  /// The tensors in the order of their data in the file.
  const std::vector<tensor_record>& tensors() const noexcept {
    return records_;
  }

  /// Reads every tensor's bytes (in tensors() order) and sets `crc32c` to the
  /// CRC32C of the whole file. Call at most once. Throws `truncated` if the
  /// file shrank since it was opened, `io` on a read error.
  std::vector<state_tensor> read_tensors(std::uint32_t& crc32c);

private:
  struct span_in_file {
    std::uint64_t begin = 0; ///< relative to the start of the data
    std::uint64_t end = 0;
  };

  void parse_header(const std::string& text, checkpoint_errc overrun);

  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t file_bytes_ = 0;
  std::uint64_t data_bytes_ = 0;
  std::uint32_t header_crc32c_ = 0; ///< over the length and the header
  std::map<std::string, std::string> metadata_;
  std::vector<tensor_record> records_;
  std::vector<span_in_file> spans_; ///< parallel to records_
};

} // namespace h2::runtime
