// The message check devices/'s tests share.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace h2::test {

/// Expects `text` to contain `needle`, printing both where it does not.
inline void expect_contains(const std::string& text,
                            const std::string& needle) {
  EXPECT_NE(text.find(needle), std::string::npos)
    << "message: " << text << "\nexpected to contain: " << needle;
}

} // namespace h2::test
