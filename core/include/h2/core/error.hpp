// H2's error types (docs/conventions.md, rule 5).
//
// - Invariants: H2_ENFORCE(cond, values...) throws h2::internal_error with the
//   condition, the location and the values that broke it.
// - Recoverable failures inside a module: the typed exceptions below.
// - Across actor boundaries: caf::error with h2's error enum (actors/).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace h2 {

/// Base of every error H2 throws; what() is one line meant for users.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A job file, plan or command line that is wrong. Carries the key path
/// ("model.n_head", "nodes[1].chips[0]") so the message can name it.
class config_error : public error {
public:
  /// `key_path` may be empty for errors about the whole document (a TOML
  /// syntax error names its line and column in `message` instead).
  config_error(std::string key_path, const std::string& message);

  /// The dotted path of the offending key, e.g. "train.micro_batch".
  const std::string& key_path() const noexcept { return key_path_; }

private:
  std::string key_path_;
};

/// What went wrong on a device.
enum class device_errc {
  out_of_memory, ///< an allocation would exceed the chip's capacity
  unavailable,   ///< the backend or the device does not exist here
  invalid,       ///< an operation the device cannot perform
};

/// A failure of a device context: out of memory, missing device, ...
class device_error : public error {
public:
  device_error(device_errc code, const std::string& message)
      : error(message), code_(code) {}

  device_errc code() const noexcept { return code_; }

private:
  device_errc code_;
};

/// What went wrong on a channel.
enum class transport_errc {
  timeout,           ///< the wait ran past the caller's deadline
  peer_closed,       ///< the other end closed or died
  corrupt_frame,     ///< a frame failed validation (magic, length, CRC)
  protocol_mismatch, ///< the peer speaks another protocol version
  unauthorized,      ///< the peer did not present the job's secret
  cancelled,         ///< this end was closed while a call was waiting
};

/// Name of a transport error code, e.g. "timeout".
std::string_view to_string(transport_errc code) noexcept;

/// A failure of a channel, stored on the I/O side and raised at the waiting
/// call.
class transport_error : public error {
public:
  transport_error(transport_errc code, const std::string& message)
      : error(message), code_(code) {}

  transport_errc code() const noexcept { return code_; }

private:
  transport_errc code_;
};

/// Work stopped because the job was cancelled (an abort).
class cancelled_error : public error {
public:
  using error::error;
};

/// A broken invariant: a bug in H2, not in the user's input.
class internal_error : public error {
public:
  using error::error;
};

namespace detail {

template <class... Ts>
std::string concat(const Ts&... xs) {
  std::ostringstream out;
  (out << ... << xs);
  return std::move(out).str();
}

[[noreturn]] void enforce_failed(const char* file, int line,
                                 const char* condition,
                                 const std::string& details);

} // namespace detail
} // namespace h2

/// Checks an invariant; on failure throws h2::internal_error naming the
/// condition, the source location and the streamed values.
#define H2_ENFORCE(condition, ...)                                             \
  do {                                                                         \
    if (!(condition))                                                          \
      ::h2::detail::enforce_failed(__FILE__, __LINE__, #condition,             \
                                   ::h2::detail::concat(__VA_ARGS__));         \
  } while (false)
