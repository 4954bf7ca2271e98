#pragma once
// File-system helpers shared by the modules.

#include <filesystem>
#include <system_error>

namespace h2 {

/// Removes `path` and, for a directory, everything under it, as
/// std::filesystem::remove_all does; symbolic links are removed, never
/// followed. A path that does not exist is no error. Returns the first
/// error, with nothing after it removed.
///
/// H2 calls this, never std::filesystem::remove_all: PyTorch's own libtorch
/// builds (2.5 and later) export a copy of libstdc++'s std::filesystem
/// (pytorch/pytorch#133437), a program linked with them can get that copy,
/// and its remove_all jumps to address 0 (docs/ditorch.md, "On a GPU").
std::error_code remove_tree(const std::filesystem::path& path) noexcept;

} // namespace h2
