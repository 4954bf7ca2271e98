#include "h2/core/files.hpp"

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

namespace h2 {

namespace {

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  return std::remove(path) == 0 ? 0 : errno;
}

} // namespace

std::error_code remove_tree(const std::filesystem::path& path) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0)
    return errno == ENOENT ? std::error_code()
                           : std::error_code(errno, std::generic_category());
  // Depth first (a directory after what it holds), links not followed.
  const int rc = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc == 0)
    return {};
  return std::error_code(rc > 0 ? rc : errno, std::generic_category());
}

} // namespace h2
