#include "h2/devices/chip_clock.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <thread>

namespace h2::devices {

chip_clock::chip_clock(clock_mode mode, wall_clock::time_point origin,
                       std::shared_ptr<const cancellation> cancel)
    : mode_(mode), origin_(origin), cancel_(std::move(cancel)) {
}

double chip_clock::wall_now() const noexcept {
  return std::chrono::duration<double>(wall_clock::now() - origin_).count();
}

void chip_clock::sleep_until_wall(double t) {
  auto deadline = origin_ + std::chrono::duration_cast<wall_clock::duration>(
                              std::chrono::duration<double>(t));
  if (!cancel_) {
    std::this_thread::sleep_until(deadline);
    return;
  }
  if (!cancel_->wait_until(deadline))
    throw cancelled_error("cancelled while waiting out emulated time");
}

void chip_clock::complete_op(double wall_start, double seconds) {
  virtual_ += seconds;
  if (mode_ != clock_mode::wall)
    return;
  double end = wall_start + seconds;
  double now = wall_now();
  if (now > end) {
    ++overruns_;
    overrun_seconds_ += now - end;
  } else {
    sleep_until_wall(end);
  }
}

double chip_clock::complete_receive(double wait_started, double sent_virtual,
                                    double sent_wall, double link_seconds) {
  virtual_ = std::max(virtual_, sent_virtual + link_seconds);
  if (mode_ == clock_mode::wall) {
    double arrival = sent_wall + link_seconds;
    if (arrival > wall_now())
      sleep_until_wall(arrival);
  }
  return std::max(0.0, now() - wait_started);
}

void chip_clock::advance_virtual_to(double t) noexcept {
  virtual_ = std::max(virtual_, t);
}

} // namespace h2::devices
