#include "h2/core/files.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

namespace h2 {
namespace {

namespace fs = std::filesystem;

fs::path make_temp_dir() {
  char tmpl[] = "/tmp/h2-files-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr)
    throw std::runtime_error("mkdtemp failed");
  return tmpl;
}

void write(const fs::path& p) {
  std::ofstream(p) << "x";
}

TEST(core_files, a_tree_is_removed_and_links_are_not_followed) {
  const auto root = make_temp_dir();
  const auto outside = make_temp_dir();
  write(outside / "kept");
  fs::create_directories(root / "a" / "b" / "c");
  write(root / "top");
  write(root / "a" / "b" / "c" / "deep");
  fs::create_directory_symlink(outside, root / "a" / "link");
  EXPECT_FALSE(remove_tree(root));
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists(outside / "kept"))
    << "a link is removed, not followed";
  EXPECT_FALSE(remove_tree(outside));
  EXPECT_FALSE(fs::exists(outside));
}

TEST(core_files, a_file_or_nothing_at_all) {
  const auto root = make_temp_dir();
  write(root / "file");
  EXPECT_FALSE(remove_tree(root / "file"));
  EXPECT_FALSE(fs::exists(root / "file"));
  EXPECT_FALSE(remove_tree(root / "none")) << "nothing to remove is no error";
  EXPECT_FALSE(remove_tree(root));
}

TEST(core_files, an_error_is_returned) {
  const auto root = make_temp_dir();
  write(root / "file");
  const auto ec = remove_tree(root / "file" / "below");
  EXPECT_EQ(ec, std::errc::not_a_directory) << ec.message();
  EXPECT_TRUE(fs::exists(root / "file"));
  EXPECT_FALSE(remove_tree(root));
}

} // namespace
} // namespace h2
