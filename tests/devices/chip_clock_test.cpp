#include "h2/devices/chip_clock.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace h2::devices {
namespace {

using wall = chip_clock::wall_clock;

TEST(devices_chip_clock, virtual_op_advances_by_exactly_its_seconds) {
  chip_clock c(clock_mode::virtual_clock, wall::now());
  EXPECT_EQ(c.mode(), clock_mode::virtual_clock);
  EXPECT_EQ(c.virtual_now(), 0.0);
  c.complete_op(c.wall_now(), 0.25);
  EXPECT_EQ(c.virtual_now(), 0.25);
  c.complete_op(c.wall_now(), 0.5);
  EXPECT_EQ(c.virtual_now(), 0.75);
  EXPECT_EQ(c.now(), 0.75);
  // A virtual op of an hour does not sleep (the test would time out) and is
  // no overrun, whatever the wall clock did meanwhile.
  c.complete_op(c.wall_now() - 10.0, 3600.0);
  EXPECT_EQ(c.virtual_now(), 3600.75);
  EXPECT_EQ(c.overruns(), 0u);
  EXPECT_EQ(c.overrun_seconds(), 0.0);
}

TEST(devices_chip_clock, receive_completes_at_max_of_own_and_sent_plus_link) {
  chip_clock c(clock_mode::virtual_clock, wall::now());
  c.complete_op(0, 1.0);
  // Sent at 2.0 over a 0.5 s link: arrives at 2.5; the chip idled 1.5 s.
  EXPECT_EQ(c.complete_receive(1.0, 2.0, 0.0, 0.5), 1.5);
  EXPECT_EQ(c.virtual_now(), 2.5);
  // Sent long ago: the frame waited for the chip; no idle time.
  EXPECT_EQ(c.complete_receive(2.5, 1.0, 0.0, 0.25), 0.0);
  EXPECT_EQ(c.virtual_now(), 2.5);
  // Arriving exactly now.
  EXPECT_EQ(c.complete_receive(2.5, 2.0, 0.0, 0.5), 0.0);
  EXPECT_EQ(c.virtual_now(), 2.5);
}

TEST(devices_chip_clock, advance_virtual_to_never_goes_back) {
  chip_clock c(clock_mode::virtual_clock, wall::now());
  c.advance_virtual_to(3.0);
  EXPECT_EQ(c.virtual_now(), 3.0);
  c.advance_virtual_to(1.0);
  EXPECT_EQ(c.virtual_now(), 3.0);
  c.advance_virtual_to(3.0);
  EXPECT_EQ(c.virtual_now(), 3.0);
  c.complete_op(0, 0.5);
  EXPECT_EQ(c.virtual_now(), 3.5);
}

TEST(devices_chip_clock, wall_op_waits_out_its_time) {
  chip_clock c(clock_mode::wall, wall::now());
  EXPECT_EQ(c.mode(), clock_mode::wall);
  double start = c.wall_now();
  c.complete_op(start, 0.02);
  EXPECT_GE(c.wall_now(), start + 0.02);
  EXPECT_EQ(c.virtual_now(), 0.02); // the virtual clock still counts
}

TEST(devices_chip_clock, wall_op_slower_than_emulated_is_an_overrun) {
  chip_clock c(clock_mode::wall, wall::now());
  double start = c.wall_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  c.complete_op(start, 0.001);
  EXPECT_EQ(c.overruns(), 1u);
  // At least the 30 ms slept minus the 1 ms allowed.
  EXPECT_GE(c.overrun_seconds(), 0.029);
  EXPECT_EQ(c.virtual_now(), 0.001);
}

TEST(devices_chip_clock, wall_receive_waits_for_arrival) {
  chip_clock c(clock_mode::wall, wall::now());
  double sent = c.wall_now();
  double waited = c.complete_receive(sent, 5.0, sent, 0.02);
  EXPECT_GE(c.wall_now(), sent + 0.02);
  EXPECT_GE(waited, 0.02);                 // measured from `sent` = wait start
  EXPECT_DOUBLE_EQ(c.virtual_now(), 5.02); // virtual bookkeeping as before
}

} // namespace
} // namespace h2::devices
