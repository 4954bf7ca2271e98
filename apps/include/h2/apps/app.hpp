// What every H2 binary does around its work: one-line errors without stack
// traces, exit codes (exit_codes.hpp).
#pragma once

#include <functional>
#include <string>

namespace h2::apps {

/// Runs `body`, mapping what escapes it to a one-line message on stderr
/// ("<program>: error: ...") and an exit code: config_error -> 2, any other
/// h2 or std exception -> 1. Returns body's exit code otherwise.
int run_app(const std::string& program, const std::function<int()>& body);

} // namespace h2::apps
