// Spin-then-wait helpers shared by the backends.
#pragma once

#include <chrono>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace h2::transport {

/// A CPU hint that this thread is spinning.
inline void cpu_relax() noexcept {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

/// `wanted` where spinning pays, else zero: with fewer than four cores a
/// spinning thread holds the core that the thread it waits for needs
/// (measured on a 2-core VM: spinning tripled the shm round trip).
inline std::chrono::nanoseconds spin_budget(std::chrono::nanoseconds wanted) {
  static const bool pays = std::thread::hardware_concurrency() >= 4;
  return pays ? wanted : std::chrono::nanoseconds(0);
}

/// Polls `ready` until it returns true or `budget` passed; returns its last
/// answer. For the short wait before a thread goes to sleep.
template <class Pred>
bool spin_until(Pred&& ready, std::chrono::nanoseconds budget) {
  auto deadline = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (ready())
        return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return ready();
  }
}

} // namespace h2::transport
