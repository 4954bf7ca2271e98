// Random bytes from the kernel (getrandom(2)) for nonces, tokens and the
// launcher's secret: one place that loops over short reads, retries on
// EINTR and reports a failing RNG as a typed error (docs/transport.md,
// Handshake), so no caller can forget to check.
#pragma once

#include "h2/core/error.hpp"

#include <cstddef>
#include <string>
#include <sys/types.h>

namespace h2 {

/// The kernel's random number generator failed. Carries the errno of the
/// failing getrandom(2) call (0 when it returned no bytes without one).
class random_error : public error {
public:
  random_error(int sys_errno, const std::string& message)
      : error(message), sys_errno_(sys_errno) {}

  int sys_errno() const noexcept { return sys_errno_; }

private:
  int sys_errno_;
};

/// Fills `out[0, n)` with cryptographically secure random bytes
/// (getrandom(2), blocking until the kernel's pool is initialised). Any
/// thread. Throws random_error naming the errno when the RNG fails.
void random_bytes(void* out, std::size_t n);

/// `bytes` random bytes as 2 * `bytes` lower-case hex digits. Throws as
/// random_bytes() does.
std::string random_hex(std::size_t bytes);

/// `data[0, n)` as 2 * `n` lower-case hex digits.
std::string hex_string(const void* data, std::size_t n);

namespace detail {

/// getrandom(2)'s signature, so tests can stand in for the kernel.
using getrandom_function = ssize_t (*)(void* out, std::size_t n,
                                       unsigned int flags);

/// random_bytes() drawing from `source` instead of getrandom(2).
void random_bytes_from(getrandom_function source, void* out, std::size_t n);

} // namespace detail
} // namespace h2
