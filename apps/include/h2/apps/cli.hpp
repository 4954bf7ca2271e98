// What every H2 binary does around its work, without libtorch or CAF (so
// that h2-data, which must not load libtorch, shares it): one-line errors
// without stack traces, exit codes (exit_codes.hpp), command-line parsing.
// app.hpp adds the errors of training runs.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>

namespace h2::apps {

/// Runs `body`, mapping what escapes it to a one-line message on stderr
/// ("<program>: error: ...") and an exit code: config_error -> 2, any other
/// exception -> 1. Returns body's exit code otherwise.
int run_cli(const std::string& program, const std::function<int()>& body);

/// Parses argv into `cli`. Returns nullopt when it parsed, or the exit code
/// once --help printed the help. A parse error is a config_error (one line,
/// "... (see --help)").
std::optional<int> parse_cli(CLI::App& cli, int argc, char** argv);

} // namespace h2::apps
