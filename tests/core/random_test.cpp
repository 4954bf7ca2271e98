#include "h2/core/random.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace h2 {
namespace {

TEST(random, hex_has_two_lower_case_digits_per_byte) {
  for (std::size_t n : {0u, 1u, 16u, 32u, 1000u}) {
    std::string h = random_hex(n);
    EXPECT_EQ(h.size(), 2 * n);
    EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos) << h;
  }
}

TEST(random, draws_differ) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i)
    seen.insert(random_hex(16));
  EXPECT_EQ(seen.size(), 100u);
}

TEST(random, bytes_fill_a_large_buffer) {
  // More than getrandom(2) returns per call (32 MiB - 1): the loop must go on.
  std::vector<unsigned char> buffer((std::size_t{32} << 20) + 4096, 0);
  random_bytes(buffer.data(), buffer.size());
  // The last page is random too: 4096 zero bytes by chance are impossible.
  std::size_t zeros = 0;
  for (std::size_t i = buffer.size() - 4096; i < buffer.size(); ++i)
    zeros += buffer[i] == 0;
  EXPECT_LT(zeros, 4096u);
}

TEST(random, hex_string_known_answer) {
  const unsigned char bytes[] = {0x00, 0x01, 0xab, 0xff, 0x7f};
  EXPECT_EQ(hex_string(bytes, sizeof(bytes)), "0001abff7f");
  EXPECT_EQ(hex_string(bytes, 0), "");
}

// A kernel that hands out one byte per call and is interrupted every other.
int calls = 0;
ssize_t short_and_interrupted(void* out, std::size_t n, unsigned int) {
  if (++calls % 2 == 0) {
    errno = EINTR;
    return -1;
  }
  if (n == 0)
    return 0;
  static_cast<unsigned char*>(out)[0] = 0x5a;
  return 1;
}

TEST(random, loops_over_short_reads_and_eintr) {
  calls = 0;
  unsigned char buffer[8] = {};
  detail::random_bytes_from(short_and_interrupted, buffer, sizeof(buffer));
  for (unsigned char b : buffer)
    EXPECT_EQ(b, 0x5a);
  EXPECT_EQ(calls, 15); // 8 reads, 7 interruptions in between
}

ssize_t broken(void*, std::size_t, unsigned int) {
  errno = ENOSYS;
  return -1;
}

TEST(random, failure_is_a_typed_error_naming_errno) {
  unsigned char buffer[4];
  try {
    detail::random_bytes_from(broken, buffer, sizeof(buffer));
    ADD_FAILURE() << "no exception";
  } catch (const random_error& e) {
    EXPECT_EQ(e.sys_errno(), ENOSYS);
    std::string what = e.what();
    EXPECT_NE(what.find("getrandom"), std::string::npos) << what;
    EXPECT_NE(what.find(std::strerror(ENOSYS)), std::string::npos) << what;
  }
}

ssize_t dry(void*, std::size_t, unsigned int) {
  errno = 0;
  return 0;
}

TEST(random, a_source_that_returns_nothing_fails_instead_of_spinning) {
  unsigned char buffer[4];
  EXPECT_THROW(detail::random_bytes_from(dry, buffer, sizeof(buffer)),
               random_error);
}

} // namespace
} // namespace h2
