// How long receives poll before they sleep (spin.hpp): adaptive_spin learns
// it from the waits it observes.
#include "h2/transport/spin.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

TEST(transport_adaptive_spin, starts_at_the_floor) {
  adaptive_spin s(50us, 500us);
  EXPECT_EQ(s.usual_wait(), 0ns);
  EXPECT_EQ(s.budget(), 50us);
}

TEST(transport_adaptive_spin, polls_about_twice_the_usual_short_wait) {
  adaptive_spin s(50us, 500us);
  for (int i = 0; i < 200; ++i)
    s.observe(100us);
  // The average converges from below to within an eighth per step.
  EXPECT_GT(s.usual_wait(), 99us);
  EXPECT_LE(s.usual_wait(), 100us);
  EXPECT_GT(s.budget(), 198us);
  EXPECT_LE(s.budget(), 200us);
  // Very short waits never poll less than the floor.
  for (int i = 0; i < 200; ++i)
    s.observe(1us);
  EXPECT_EQ(s.budget(), 50us);
}

TEST(transport_adaptive_spin, long_waits_fall_back_to_the_floor) {
  adaptive_spin s(50us, 500us);
  for (int i = 0; i < 200; ++i)
    s.observe(300us); // twice is past the ceiling: capped
  EXPECT_EQ(s.budget(), 500us);
  for (int i = 0; i < 200; ++i)
    s.observe(10ms); // compute-bound: polling would only burn the core
  EXPECT_EQ(s.budget(), 50us);
  s.observe(-5us); // a clock step back counts as no wait
  EXPECT_GE(s.usual_wait(), 0ns);
}

} // namespace
} // namespace h2::transport
