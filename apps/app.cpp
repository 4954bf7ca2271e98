#include "h2/apps/app.hpp"

#include "h2/actors/errors.hpp"
#include "h2/core/text.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/core/error.hpp"

#include <iostream>

namespace h2::apps {

namespace {

/// The first line of `what`, printable: messages stay one line whatever
/// wrapped them, and a name from a job file cannot drive the terminal.
std::string first_line(const std::string& what) {
  return printable(what.substr(0, what.find('\n')));
}

} // namespace

int run_app(const std::string& program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const config_error& e) {
    std::cerr << program << ": error: " << first_line(e.what()) << std::endl;
    return exit_bad_input;
  } catch (const actors::run_error& e) {
    if (e.code() == actors::errc::bad_config) { // found by another node
      std::cerr << program << ": error: " << first_line(e.what()) << std::endl;
      return exit_bad_input;
    }
    std::cerr << program << ": training failed (" << to_string(e.code())
              << "): " << first_line(e.what()) << std::endl;
    return e.code() == actors::errc::peer_lost ? exit_peer_failed
                                               : exit_failed;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << first_line(e.what()) << std::endl;
    return exit_failed;
  }
}

} // namespace h2::apps
