// Helpers for asserting H2's typed errors in core/'s tests.
#pragma once

#include "h2/core/error.hpp"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

namespace h2::test {

/// Runs `f`, expecting h2::config_error with exactly `key_path` and a
/// message containing every one of `needles`. Any other outcome (no throw,
/// another exception type, another key, another message) fails the test.
template <class F>
void expect_config_error(F&& f, const std::string& key_path,
                         std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected config_error at '" << key_path
                  << "'";
  } catch (const config_error& e) {
    EXPECT_EQ(e.key_path(), key_path) << "message: " << e.what();
    std::string what = e.what();
    if (!key_path.empty()) {
      EXPECT_EQ(what.rfind(key_path + ": ", 0), 0u)
        << "message should start with the key path: " << what;
    }
    for (const auto& needle : needles)
      EXPECT_NE(what.find(needle), std::string::npos)
        << "message: " << what << "\nexpected to contain: " << needle;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected config_error at '" << key_path
                  << "', got another exception: " << e.what();
  }
}

} // namespace h2::test
