// The progress watchdog's rule on a clock stepped by hand: a chip's op is
// stalled once it has run longer than factor x its prediction and longer
// than the floor; ops without a prediction use their last duration; a
// suspension (rebalance, pause, checkpoint wait) stalls nothing and
// restarts the count.
#include "h2/runtime/watchdog.hpp"

#include <gtest/gtest.h>

#include <atomic>

namespace h2::runtime {
namespace {

using namespace std::chrono_literals;

const watchdog_clock::time_point t0{};

watchdog_config config(double factor, double floor_seconds) {
  watchdog_config c;
  c.factor = factor;
  c.floor_seconds = floor_seconds;
  return c;
}

TEST(runtime_watchdog, a_hung_op_is_stalled_past_factor_times_its_prediction) {
  progress_watchdog w(config(10, 2));
  auto chip = w.watch({0, 1});
  chip->begin("backward", 3, 0.5, t0); // limit: max(10 x 0.5, 2) = 5 s
  EXPECT_TRUE(w.check(t0 + 4900ms).empty());
  auto stalls = w.check(t0 + 5100ms);
  ASSERT_EQ(stalls.size(), 1u);
  EXPECT_EQ(stalls[0].chip, (chip_id{0, 1}));
  EXPECT_EQ(stalls[0].op, "backward");
  EXPECT_EQ(stalls[0].micro_batch, 3);
  EXPECT_DOUBLE_EQ(stalls[0].limit_seconds, 5);
  const auto m = stalls[0].message();
  EXPECT_NE(m.find("chip 0:1 stalled: its backward of micro-batch 3 has run "
                   "5.1 s"),
            std::string::npos)
    << m;
  EXPECT_NE(m.find("past 5.0 s (watchdog.factor x its predicted 0.500 s)"),
            std::string::npos)
    << m;
  // The op ends: nothing is stalled any more.
  chip->end(t0 + 6s);
  EXPECT_TRUE(w.check(t0 + 60s).empty());
}

TEST(runtime_watchdog, the_floor_covers_short_predictions) {
  progress_watchdog w(config(10, 2));
  auto chip = w.watch({0, 0});
  chip->begin("forward", 0, 0.001, t0); // 10 x 1 ms < the 2 s floor
  EXPECT_TRUE(w.check(t0 + 1900ms).empty());
  ASSERT_EQ(w.check(t0 + 2100ms).size(), 1u);
  EXPECT_NE(w.check(t0 + 2100ms)[0].message().find(
              "past watchdog.floor_seconds (2.0 s)"),
            std::string::npos)
    << w.check(t0 + 2100ms)[0].message();
}

TEST(runtime_watchdog, without_a_prediction_the_last_duration_counts) {
  progress_watchdog w(config(3, 1));
  auto chip = w.watch({0, 0});
  chip->begin("optimizer", -1, -1, t0); // first time: the floor alone
  EXPECT_TRUE(w.check(t0 + 900ms).empty());
  chip->end(t0 + 800ms);
  chip->begin("optimizer", -1, -1, t0 + 1s); // predicted: the last 0.8 s
  EXPECT_TRUE(w.check(t0 + 1s + 2300ms).empty());
  ASSERT_EQ(w.check(t0 + 1s + 2500ms).size(), 1u);
  EXPECT_DOUBLE_EQ(w.check(t0 + 1s + 2500ms)[0].predicted_seconds, 0.8);
}

TEST(runtime_watchdog, a_suspension_stalls_nothing_and_restarts_the_count) {
  progress_watchdog w(config(10, 1));
  auto a = w.watch({0, 0});
  auto b = w.watch({0, 1});
  a->begin("forward", 0, 0.1, t0);
  w.suspend();
  w.suspend(); // nested: a pause during a checkpoint wait
  EXPECT_TRUE(w.check(t0 + 100s).empty());
  w.resume(t0 + 100s);
  EXPECT_TRUE(w.check(t0 + 101s).empty()); // still suspended once
  w.resume(t0 + 200s);
  EXPECT_TRUE(w.check(t0 + 200s + 900ms).empty()); // counts from the resume
  ASSERT_EQ(w.check(t0 + 200s + 1100ms).size(), 1u);
  // Ops begun after the resume count from their own start.
  b->begin("forward", 0, 0.1, t0 + 300s);
  auto both = w.check(t0 + 300s + 1100ms);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[1].chip, (chip_id{0, 1}));
}

TEST(runtime_watchdog, factor_zero_turns_it_off) {
  progress_watchdog w(config(0, 1));
  w.watch({0, 0})->begin("forward", 0, 0.1, t0);
  EXPECT_TRUE(w.check(t0 + std::chrono::hours(24)).empty());
}

TEST(runtime_watchdog, the_thread_reports_the_first_stall_once_and_marks_it) {
  auto w = std::make_shared<progress_watchdog>(config(1, 0.001));
  auto chip = w->watch({1, 0});
  chip->begin("forward", 2, 0.0001, watchdog_clock::now() - 1s);
  std::atomic<int> stalls{0}, stuck{0};
  std::mutex m;
  std::condition_variable reported;
  {
    watchdog_thread thread(
      w,
      [&](const stall& s) {
        EXPECT_EQ(s.chip, (chip_id{1, 0}));
        std::lock_guard<std::mutex> g(m);
        ++stalls;
        reported.notify_all();
      },
      [&](const stall&) { ++stuck; }, 1ms, 3600s);
    std::unique_lock<std::mutex> lock(m);
    ASSERT_TRUE(reported.wait_for(lock, 20s, [&] { return stalls > 0; }));
    ASSERT_TRUE(thread.stalled().has_value());
    EXPECT_EQ(thread.stalled()->chip, (chip_id{1, 0}));
  } // stopped within its grace: not stuck
  EXPECT_EQ(stalls.load(), 1);
  EXPECT_EQ(stuck.load(), 0);
  EXPECT_NE(chip->stalled().find("chip 1:0 stalled"), std::string::npos);
}

} // namespace
} // namespace h2::runtime
