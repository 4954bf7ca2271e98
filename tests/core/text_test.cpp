#include "h2/core/text.hpp"

#include <gtest/gtest.h>

namespace h2 {
namespace {

TEST(core_text, control_characters_print_as_escapes) {
  // Issue 24: a job name with an OSC sequence (set the terminal's title)
  // and an ESC [ sequence prints inert, on one line.
  EXPECT_EQ(printable("e2e\x1b]0;pwned\x07 \x1b[2J"),
            "e2e\\x1b]0;pwned\\x07 \\x1b[2J");
  EXPECT_EQ(printable(std::string("a\0b\nc\x7f", 6)), "a\\x00b\\x0ac\\x7f");
  EXPECT_EQ(printable("plain text, \xc3\xa9t\xc3\xa9 \\ too"),
            "plain text, \xc3\xa9t\xc3\xa9 \\ too");
  EXPECT_EQ(printable(""), "");
}

} // namespace
} // namespace h2
