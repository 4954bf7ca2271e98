#include "h2/actors/errors.hpp"

#include "h2/runtime/safetensors.hpp"
#include "h2/runtime/watchdog.hpp"

#include <caf/make_message.hpp>
#include <caf/message.hpp>

#include <algorithm>

namespace h2::actors {

std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::out_of_memory:
      return "out of memory";
    case errc::device_unavailable:
      return "device unavailable";
    case errc::transport_timeout:
      return "transport timeout";
    case errc::peer_lost:
      return "peer lost";
    case errc::corrupt_frame:
      return "corrupt frame";
    case errc::unauthorized:
      return "unauthorized";
    case errc::cancelled:
      return "cancelled";
    case errc::bad_config:
      return "bad configuration";
    case errc::internal:
      return "internal error";
    case errc::failed:
      return "failed";
    case errc::step_timeout:
      return "step timeout";
    case errc::checkpoint:
      return "checkpoint";
    case errc::stalled:
      return "stalled";
  }
  return "unknown";
}

caf::error make_error(errc code, std::string message) {
  return caf::error(static_cast<std::uint8_t>(code), error_category,
                    caf::make_message(std::move(message)));
}

caf::error current_exception_error() {
  try {
    throw;
  } catch (const device_error& e) {
    return make_error(e.code() == device_errc::out_of_memory
                        ? errc::out_of_memory
                        : errc::device_unavailable,
                      e.what());
  } catch (const transport_error& e) {
    errc code = errc::failed;
    switch (e.code()) {
      case transport_errc::timeout:
        code = errc::transport_timeout;
        break;
      case transport_errc::peer_closed:
        code = errc::peer_lost;
        break;
      case transport_errc::corrupt_frame:
      case transport_errc::protocol_mismatch:
        code = errc::corrupt_frame;
        break;
      case transport_errc::unauthorized:
        code = errc::unauthorized;
        break;
      case transport_errc::cancelled:
        code = errc::cancelled;
        break;
    }
    return make_error(code, e.what());
  } catch (const config_error& e) {
    return make_error(errc::bad_config, e.what());
  } catch (const cancelled_error& e) {
    return make_error(errc::cancelled, e.what());
  } catch (const internal_error& e) {
    return make_error(errc::internal, e.what());
  } catch (const runtime::checkpoint_error& e) {
    return make_error(errc::checkpoint, e.what());
  } catch (const runtime::stalled_error& e) {
    return make_error(errc::stalled, e.what());
  } catch (const std::exception& e) {
    return make_error(errc::failed, e.what());
  } catch (...) {
    return make_error(errc::failed, "unknown exception");
  }
}

caf::error exception_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (...) {
    return current_exception_error();
  }
}

failure to_failure(const caf::error& e) {
  failure f;
  if (e.category() == error_category) {
    f.code = static_cast<errc>(e.code());
    if (e.context().match_elements<std::string>())
      f.message = e.context().get_as<std::string>(0);
    else
      f.message = std::string(to_string(f.code));
  } else {
    f.code = errc::failed;
    f.message = caf::to_string(e);
  }
  return f;
}

failure root_cause(const std::vector<failure>& failures) {
  H2_ENFORCE(!failures.empty(), "no failures");
  // Consequences rank last: a lost peer or a cancelled wait is what the
  // neighbours of the failing chip see.
  auto rank = [](errc c) {
    switch (c) {
      case errc::cancelled:
        return 3;
      case errc::peer_lost:
        return 2;
      case errc::transport_timeout:
        return 1;
      default:
        return 0;
    }
  };
  return *std::min_element(failures.begin(), failures.end(),
                           [&](const failure& a, const failure& b) {
                             return rank(a.code) < rank(b.code);
                           });
}

std::string render_error(std::uint8_t code, caf::atom_value,
                         const caf::message& context) {
  std::string out(to_string(static_cast<errc>(code)));
  if (context.match_elements<std::string>())
    out += ": " + context.get_as<std::string>(0);
  return out;
}

} // namespace h2::actors
