// Spin-then-wait helpers shared by the backends.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
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

/// How long a receive should poll before it sleeps, learned from how long
/// receives waited: about twice the usual wait when that is short, so that
/// a stream of messages arriving every few tens of microseconds is taken
/// without any system call (on these VMs a system call flushes the TLB, a
/// sixth of a 1-4 MiB copy), and only `floor` when waits are usually longer
/// than `ceiling` (compute-bound pipelines: spinning would only burn the
/// core). Thread-safe; concurrent observations may lose one another, which
/// only blurs the estimate.
class adaptive_spin {
public:
  /// Requires floor <= ceiling.
  adaptive_spin(std::chrono::nanoseconds floor,
                std::chrono::nanoseconds ceiling)
      : floor_(floor.count()), ceiling_(ceiling.count()) {}

  /// How long to poll now.
  std::chrono::nanoseconds budget() const noexcept {
    const std::int64_t usual = average_.load(std::memory_order_relaxed);
    if (usual > ceiling_)
      return std::chrono::nanoseconds(floor_);
    return std::chrono::nanoseconds(std::clamp(2 * usual, floor_, ceiling_));
  }

  /// A receive got its message after `waited`.
  void observe(std::chrono::nanoseconds waited) noexcept {
    const std::int64_t w = std::max<std::int64_t>(0, waited.count());
    const std::int64_t old = average_.load(std::memory_order_relaxed);
    // An exponential average over about the last eight waits.
    average_.store(old + (w - old) / 8, std::memory_order_relaxed);
  }

  /// The usual wait so far (0 before the first).
  std::chrono::nanoseconds usual_wait() const noexcept {
    return std::chrono::nanoseconds(average_.load(std::memory_order_relaxed));
  }

private:
  std::int64_t floor_;
  std::int64_t ceiling_;
  std::atomic<std::int64_t> average_{0};
};

} // namespace h2::transport
