// Waking a thread that sleeps in poll(2) on an eventfd, shared by the
// backends: the waker adds to the eventfd's count, the woken thread empties
// it before it looks again.
#pragma once

#include <unistd.h>

#include <cstdint>

namespace h2::transport {

/// Adds one to eventfd `fd`'s count. A write that fails finds the count
/// full, which already wakes the poller.
inline void wake(int fd) noexcept {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(fd, &one, sizeof(one));
}

/// Empties non-blocking eventfd `fd`'s count (an empty one stays empty).
inline void drain_wakes(int fd) noexcept {
  std::uint64_t count = 0;
  [[maybe_unused]] const auto n = ::read(fd, &count, sizeof(count));
}

} // namespace h2::transport
