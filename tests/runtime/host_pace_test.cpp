// The host-pace warning (runtime/host_pace.hpp, docs/emulation.md): said
// once, naming the chip whose overruns over a window of steps are largest
// against its charge, never during warm-up, for one noisy step, or when
// every chip keeps up.
#include "h2/runtime/host_pace.hpp"

#include <gtest/gtest.h>

namespace h2::runtime {
namespace {

/// A step in which chip 0:i was busy busy[i] seconds (overruns included)
/// and has overrun overrun[i] seconds since the start.
step_summary step(int index, std::vector<double> busy,
                  std::vector<double> overrun) {
  step_summary s;
  s.step = index;
  for (std::size_t i = 0; i < busy.size(); ++i) {
    chip_step_stats c;
    c.chip = chip_id{0, static_cast<int>(i)};
    c.forward_seconds = busy[i] / 3;
    c.backward_seconds = 2 * busy[i] / 3;
    c.overrun_seconds = overrun[i];
    s.chips.push_back(c);
  }
  return s;
}

TEST(runtime_host_pace, a_host_that_keeps_up_is_never_named) {
  host_pace_watch watch;
  double over = 0;
  for (int i = 0; i < 50; ++i) {
    over += 0.009; // 9% of a 0.1 s charge: under the 10% tolerance
    EXPECT_FALSE(watch.observe(step(i, {0.109, 0.2}, {over, 0})));
  }
}

TEST(runtime_host_pace, the_chip_most_behind_is_named_once) {
  host_pace_watch watch(1, 2);
  // The warm-up step overruns a lot and is not judged.
  EXPECT_FALSE(watch.observe(step(0, {1.0, 1.0}, {0.9, 0.9})));
  EXPECT_FALSE(watch.observe(step(1, {0.3, 0.3}, {1.0, 1.1})));
  // Steps 2-3: chip 0:0 took 0.6 s for a 0.4 s charge (1.5x); chip 0:1
  // 0.6 s for 0.2 s (3x).
  auto said = watch.observe(step(2, {0.3, 0.3}, {1.1, 1.3}));
  ASSERT_TRUE(said);
  EXPECT_NE(said->find("chip 0:1"), std::string::npos) << *said;
  EXPECT_NE(said->find("steps 2-3"), std::string::npos) << *said;
  EXPECT_NE(said->find("3.00x"), std::string::npos) << *said;
  EXPECT_NE(said->find("time_scale"), std::string::npos) << *said;
  EXPECT_FALSE(watch.observe(step(3, {0.3, 0.3}, {1.2, 1.5})));
}

TEST(runtime_host_pace, one_noisy_step_is_not_a_host_behind) {
  host_pace_watch watch(0, 5);
  double over = 0;
  for (int i = 0; i < 40; ++i) {
    // A 0.1 s charge; every tenth step overruns by 40%, the window by 8%.
    over += i % 10 == 9 ? 0.04 : 0;
    EXPECT_FALSE(watch.observe(step(i, {0.1 + (i % 10 == 9 ? 0.04 : 0)},
                                    {over})))
      << "step " << i;
  }
}

TEST(runtime_host_pace, overruns_count_per_step_not_since_the_start) {
  host_pace_watch watch(2, 1);
  EXPECT_FALSE(watch.observe(step(0, {1.0}, {0.9})));
  EXPECT_FALSE(watch.observe(step(1, {1.0}, {1.8})));
  // Warm-up left 1.8 s of overruns, far more than this step's 0.1 s, but
  // this step added none.
  EXPECT_FALSE(watch.observe(step(2, {0.1}, {1.8})));
  EXPECT_TRUE(watch.observe(step(3, {0.5}, {2.2})));
}

} // namespace
} // namespace h2::runtime
