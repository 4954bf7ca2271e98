// Errors across actor boundaries (docs/conventions.md, rule 5): caf::error with
// H2's category and code, the one-line message as context. Exceptions thrown
// inside a chip become these at the actor boundary and exceptions again
// (run_error) where the application waits.
#pragma once

#include "h2/core/error.hpp"

#include <caf/atom.hpp>
#include <caf/error.hpp>

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace h2::actors {

/// H2's error codes in caf::error (category "h2").
enum class errc : std::uint8_t {
  out_of_memory = 1,
  device_unavailable,
  transport_timeout,
  peer_lost, ///< a neighbour closed or died (often a consequence)
  corrupt_frame,
  unauthorized,
  cancelled, ///< aborted by this process (second signal, shutdown)
  bad_config,
  internal,
  failed,       ///< any other failure
  step_timeout, ///< a chip did not answer within runtime.step_timeout_seconds
  checkpoint,   ///< a checkpoint could not be written or read
  stalled,      ///< the watchdog gave up on a chip's op (runtime/watchdog.hpp)
};

/// The caf::error category atom of H2's errors.
constexpr caf::atom_value error_category = caf::atom("h2");

std::string_view to_string(errc code) noexcept;

/// A caf::error carrying `code` and the one-line `message`.
caf::error make_error(errc code, std::string message);

/// Classifies the exception in flight (h2 errors by type, others as failed).
caf::error current_exception_error();

/// Classifies a stored exception the same way.
caf::error exception_error(const std::exception_ptr& e);

/// A failure as the application sees it.
struct failure {
  errc code = errc::failed;
  std::string message;
};

/// Reads an H2 caf::error back; other categories become errc::failed with
/// CAF's rendering of the error.
failure to_failure(const caf::error& e);

/// Of several chips' failures, the one that caused the others: a chip that
/// ran out of memory makes its neighbours see peer_lost and cancelled.
failure root_cause(const std::vector<failure>& failures);

/// Renders H2 errors for CAF's actor_system::render (add_error_category).
std::string render_error(std::uint8_t code, caf::atom_value category,
                         const caf::message& context);

/// What local_job::run throws when training fails.
class run_error : public h2::error {
public:
  run_error(failure f) : h2::error(f.message), code_(f.code) {}
  errc code() const noexcept { return code_; }

private:
  errc code_;
};

} // namespace h2::actors
