#include "checkpoint_io.hpp"

#include "h2/core/crc32c.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace h2::runtime {

std::string_view to_string(checkpoint_errc kind) noexcept {
  // In the order of the enumerators.
  static constexpr std::string_view names[] = {
    "missing", "truncated", "corrupt", "mismatch", "foreign", "io"};
  const auto i = static_cast<std::size_t>(kind);
  return i < std::size(names) ? names[i] : "unknown";
}

checkpoint_error::checkpoint_error(checkpoint_errc kind,
                                   std::filesystem::path file,
                                   const std::string& message)
    : error((file.empty() ? std::string() : file.string() + ": ") +
            std::string(to_string(kind)) + ": " + message),
      kind_(kind),
      file_(std::move(file)) {
}

namespace detail {
namespace {

/// Closes a descriptor on every path out of a scope.
class fd_guard {
public:
  explicit fd_guard(int fd) : fd_(fd) {}
  ~fd_guard() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;

  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

private:
  int fd_;
};

} // namespace

std::string hex32(std::uint32_t value) {
  char text[11];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

void throw_errno(checkpoint_errc kind, const std::filesystem::path& file,
                 const std::string& what) {
  const int code = errno;
  throw checkpoint_error(kind, file, what + ": " + std::strerror(code));
}

written_file
write_file_synced(const std::filesystem::path& path,
                  std::span<const std::span<const std::uint8_t>> pieces) {
  // A new file, always: what was there (a link planted to make us write
  // elsewhere, a file another process holds open) is unlinked, never
  // truncated or written through.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    throw_errno(checkpoint_errc::io, path, "cannot replace");
  fd_guard fd(::open(path.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     0644));
  if (fd.get() < 0)
    throw_errno(checkpoint_errc::io, path, "cannot create");
  written_file result;
  for (auto piece : pieces) {
    const std::uint8_t* at = piece.data();
    std::size_t left = piece.size();
    while (left > 0) {
      const ssize_t n = ::write(fd.get(), at, left);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        throw_errno(checkpoint_errc::io, path, "cannot write");
      at += n;
      left -= static_cast<std::size_t>(n);
    }
    result.bytes += piece.size();
  }
  // The checksum is computed while the disk writes (docs/benchmarks.md,
  // Checkpoints): the writeback starts now, and the CRC of the same bytes,
  // which nobody changes meanwhile, hides behind it instead of delaying the
  // writes. Best effort: fsync reports any write error.
  ::sync_file_range(fd.get(), 0, 0, SYNC_FILE_RANGE_WRITE);
  for (auto piece : pieces)
    result.crc32c = crc32c(piece.data(), piece.size(), result.crc32c);
  if (::fsync(fd.get()) != 0)
    throw_errno(checkpoint_errc::io, path, "cannot fsync");
  // close() can report a deferred write error (NFS): check it.
  if (::close(fd.release()) != 0)
    throw_errno(checkpoint_errc::io, path, "cannot close");
  return result;
}

void sync_directory(const std::filesystem::path& dir) {
  fd_guard fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0)
    throw_errno(checkpoint_errc::io, dir, "cannot open directory");
  if (::fsync(fd.get()) != 0)
    throw_errno(checkpoint_errc::io, dir, "cannot fsync directory");
}

int open_for_reading(const std::filesystem::path& path, std::uint64_t& bytes) {
  // O_NONBLOCK: opening a FIFO would wait for a writer. It changes nothing
  // for a regular file, the only kind that is read.
  fd_guard fd(
    ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT)
      throw checkpoint_error(checkpoint_errc::missing, path, "no such file");
    if (errno == ELOOP)
      throw checkpoint_error(checkpoint_errc::corrupt, path,
                             "a symbolic link, not a regular file");
    throw_errno(checkpoint_errc::io, path, "cannot open");
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw_errno(checkpoint_errc::io, path, "cannot stat");
  if (!S_ISREG(st.st_mode))
    throw checkpoint_error(checkpoint_errc::corrupt, path,
                           "not a regular file");
  bytes = static_cast<std::uint64_t>(st.st_size);
  return fd.release();
}

void check_json_depth(std::string_view text,
                      const std::filesystem::path& file) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i; // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_json_depth)
        throw checkpoint_error(checkpoint_errc::corrupt, file,
                               "JSON nested deeper than " +
                                 std::to_string(max_json_depth) +
                                 " levels (at byte " + std::to_string(i) +
                                 ")");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

std::string read_small_file(const std::filesystem::path& path,
                            std::uint64_t max_bytes) {
  std::uint64_t size = 0;
  fd_guard fd(open_for_reading(path, size));
  if (size > max_bytes)
    throw checkpoint_error(checkpoint_errc::corrupt, path,
                           "the file has " + std::to_string(size) +
                             " bytes, over the limit of " +
                             std::to_string(max_bytes));
  std::string text(size, '\0');
  read_exact(fd.get(), text.data(), text.size(), path);
  return text;
}

void read_exact(int fd, void* out, std::size_t size,
                const std::filesystem::path& path) {
  auto* at = static_cast<std::uint8_t*>(out);
  std::size_t left = size;
  while (left > 0) {
    const ssize_t n = ::read(fd, at, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      throw_errno(checkpoint_errc::io, path, "cannot read");
    if (n == 0)
      throw checkpoint_error(checkpoint_errc::truncated, path,
                             "the file ended early (it shrank while read)");
    at += n;
    left -= static_cast<std::size_t>(n);
  }
}

} // namespace detail
} // namespace h2::runtime
