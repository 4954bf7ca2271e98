#include "h2/core/error.hpp"

namespace h2 {

config_error::config_error(std::string key_path, const std::string& message)
    : error(key_path.empty() ? message : key_path + ": " + message),
      key_path_(std::move(key_path)) {
}

std::string_view to_string(transport_errc code) noexcept {
  switch (code) {
    case transport_errc::timeout:
      return "timeout";
    case transport_errc::peer_closed:
      return "peer closed";
    case transport_errc::corrupt_frame:
      return "corrupt frame";
    case transport_errc::protocol_mismatch:
      return "protocol mismatch";
    case transport_errc::unauthorized:
      return "unauthorized";
    case transport_errc::cancelled:
      return "cancelled";
  }
  return "unknown";
}

namespace detail {

void enforce_failed(const char* file, int line, const char* condition,
                    const std::string& details) {
  std::string msg =
    concat("internal error: ", condition, " failed at ", file, ":", line);
  if (!details.empty())
    msg += " (" + details + ")";
  throw internal_error(msg);
}

} // namespace detail
} // namespace h2
