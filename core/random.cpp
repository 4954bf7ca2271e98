#include "h2/core/random.hpp"

#include <cerrno>
#include <cstring>
#include <sys/random.h>

namespace h2 {

namespace detail {

void random_bytes_from(getrandom_function source, void* out, std::size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t done = 0;
  while (done < n) {
    // getrandom(2) returns at most 32 MiB - 1 per call and may return fewer
    // bytes than asked when a signal arrives: loop until all are there.
    ssize_t got = source(p + done, n - done, 0);
    if (got > 0) {
      done += static_cast<std::size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR)
      continue;
    const int err = got < 0 ? errno : 0;
    throw random_error(err, "no randomness: getrandom(2) failed after " +
                              std::to_string(done) + " of " +
                              std::to_string(n) + " bytes (" +
                              (err != 0 ? std::string(std::strerror(err))
                                        : std::string("it returned no bytes")) +
                              ")");
  }
}

} // namespace detail

void random_bytes(void* out, std::size_t n) {
  detail::random_bytes_from(
    [](void* buffer, std::size_t size, unsigned int flags) -> ssize_t {
      return ::getrandom(buffer, size, flags);
    },
    out, n);
}

std::string hex_string(const void* data, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  const auto* p = static_cast<const unsigned char*>(data);
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(digits[p[i] >> 4]);
    out.push_back(digits[p[i] & 15]);
  }
  return out;
}

std::string random_hex(std::size_t bytes) {
  std::string raw(bytes, '\0');
  random_bytes(raw.data(), raw.size());
  return hex_string(raw.data(), raw.size());
}

} // namespace h2
