// POSIX file calls of the checkpoint files (docs/checkpoints.md): durable
// writes (write, fsync, directory fsync) and exact reads, every failure a
// checkpoint_error naming the file. Private to runtime/.
#pragma once

#include "h2/runtime/safetensors.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace h2::runtime::detail {

/// "0x0123abcd": a CRC32C as the error messages print it.
std::string hex32(std::uint32_t value);

/// Throws checkpoint_error(`kind`, `file`) with "<what>: <strerror(errno)>".
[[noreturn]] void throw_errno(checkpoint_errc kind,
                              const std::filesystem::path& file,
                              const std::string& what);

/// Creates `path` as a new file (an entry there, a link included, is
/// unlinked first: never truncated or followed), writes `pieces` one after
/// the other, fsyncs
/// and closes it. Returns the size and CRC32C of what was written (computed
/// while the disk writes: `pieces` must not change until this returns).
/// Throws checkpoint_error(io).
written_file
write_file_synced(const std::filesystem::path& path,
                  std::span<const std::span<const std::uint8_t>> pieces);

/// fsyncs the directory `dir`, so the entries created, renamed or removed in
/// it survive a power loss. Throws checkpoint_error(io).
void sync_directory(const std::filesystem::path& dir);

/// Opens `path` read-only and returns its descriptor (the caller closes it).
/// A checkpoint directory is hostile input: a symbolic link or anything not
/// a regular file (a FIFO, a device) is refused before a byte is read, and
/// opening never blocks. Throws `missing` if it does not exist, `corrupt`
/// if it is a link or not a regular file, `io` otherwise. `bytes` receives
/// its size.
int open_for_reading(const std::filesystem::path& path, std::uint64_t& bytes);

/// The deepest JSON that checkpoint files may hold: arrays and objects
/// nested at most this far (H2's own nest 6 deep).
inline constexpr int max_json_depth = 64;

/// Throws `corrupt` when `text` nests arrays and objects deeper than
/// max_json_depth, before anything parses it: nlohmann's dump() recurses a
/// level at a time, so a million nested arrays would exhaust the stack.
/// Brackets inside strings do not count.
void check_json_depth(std::string_view text, const std::filesystem::path& file);

/// The whole of `path`, a file of at most `max_bytes` (else `corrupt`):
/// `missing`, `io` as open_for_reading().
std::string read_small_file(const std::filesystem::path& path,
                            std::uint64_t max_bytes);

/// Reads exactly `size` bytes from `fd` into `out`; an early end of file is
/// `truncated`, a read error `io`.
void read_exact(int fd, void* out, std::size_t size,
                const std::filesystem::path& path);

} // namespace h2::runtime::detail
