#include "h2/apps/app.hpp"

#include "h2/actors/errors.hpp"
#include "h2/apps/cli.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/core/error.hpp"
#include "h2/core/text.hpp"

#include <iostream>

namespace h2::apps {

int run_app(const std::string& program, const std::function<int()>& body) {
  return run_cli(program, [&] {
    try {
      return body();
    } catch (const actors::run_error& e) {
      const std::string what = e.what();
      const auto line = printable(what.substr(0, what.find('\n')));
      if (e.code() == actors::errc::bad_config) { // found by another node
        std::cerr << program << ": error: " << line << std::endl;
        return exit_bad_input;
      }
      std::cerr << program << ": training failed (" << to_string(e.code())
                << "): " << line << std::endl;
      return e.code() == actors::errc::peer_lost ? exit_peer_failed
                                                 : exit_failed;
    }
  });
}

} // namespace h2::apps
