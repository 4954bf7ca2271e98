#include "h2/apps/cli.hpp"

#include "h2/apps/exit_codes.hpp"
#include "h2/core/error.hpp"
#include "h2/core/text.hpp"

#include <iostream>

namespace h2::apps {

namespace {

/// The first line of `what`, printable: messages stay one line whatever
/// wrapped them, and a name from a job file cannot drive the terminal.
std::string first_line(const std::string& what) {
  return printable(what.substr(0, what.find('\n')));
}

} // namespace

int run_cli(const std::string& program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const config_error& e) {
    std::cerr << program << ": error: " << first_line(e.what()) << std::endl;
    return exit_bad_input;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << first_line(e.what()) << std::endl;
    return exit_failed;
  }
}

std::optional<int> parse_cli(CLI::App& cli, int argc, char** argv) {
  try {
    cli.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) // --help
      return cli.exit(e);
    // One line like every other bad input (CLI11's own report adds a
    // second line, "Run with --help ...").
    throw config_error("", std::string(e.what()) + " (see --help)");
  }
}

} // namespace h2::apps
