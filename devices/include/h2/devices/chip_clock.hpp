// A chip's time (docs/architecture.md, "Emulated chips": two clocks).
//
// Every chip keeps a virtual clock: each op advances it by the op's time
// (emulated, or measured on real devices) and a receive completes at
// max(own clock, sender's clock + link time). Under clock = "wall" the chip
// also waits out that time for real, so concurrency is real; ops whose real
// CPU time exceeds their emulated time are counted as overruns.
#pragma once

#include "h2/core/cancellation.hpp"
#include "h2/core/job.hpp"

#include <chrono>
#include <cstdint>
#include <memory>

namespace h2::devices {

class chip_clock {
public:
  using wall_clock = std::chrono::steady_clock;

  /// `origin` is the wall time that counts as 0 (shared by all chips of a
  /// process so wall timestamps compare). Wall-clock waits end early with
  /// cancelled_error once `cancel` (may be null) is cancelled.
  chip_clock(clock_mode mode, wall_clock::time_point origin,
             std::shared_ptr<const cancellation> cancel = nullptr);

  clock_mode mode() const noexcept { return mode_; }

  /// The virtual clock, seconds.
  double virtual_now() const noexcept { return virtual_; }

  /// Seconds of wall time since the origin.
  double wall_now() const noexcept;

  /// The clock the run is timed by: virtual or wall.
  double now() const noexcept {
    return mode_ == clock_mode::wall ? wall_now() : virtual_;
  }

  /// Completes an op that started at wall time `wall_start` (seconds since
  /// origin) and takes `seconds`: advances the virtual clock and, under the
  /// wall clock, sleeps until wall_start + seconds (counting an overrun
  /// when that moment has already passed).
  void complete_op(double wall_start, double seconds);

  /// Completes a receive of a frame sent at (`sent_virtual`, `sent_wall`)
  /// over a link taking `link_seconds`. Returns the seconds this chip spent
  /// idle waiting for it, in the run's clock (virtual or wall), measured from
  /// `wait_started` (the run clock when the chip began waiting).
  double complete_receive(double wait_started, double sent_virtual,
                          double sent_wall, double link_seconds);

  /// Moves the virtual clock forward to `t` (never backward): a barrier such
  /// as the start of a step. Wall time needs no such help.
  void advance_virtual_to(double t) noexcept;

  std::uint64_t overruns() const noexcept { return overruns_; }
  double overrun_seconds() const noexcept { return overrun_seconds_; }

private:
  void sleep_until_wall(double t);

  clock_mode mode_;
  wall_clock::time_point origin_;
  std::shared_ptr<const cancellation> cancel_;
  double virtual_ = 0;
  std::uint64_t overruns_ = 0;
  double overrun_seconds_ = 0;
};

} // namespace h2::devices
