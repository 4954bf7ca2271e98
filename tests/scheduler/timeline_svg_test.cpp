// The SVG timeline of a simulated step (h2-plan --svg): one labelled row per
// stage, one bar per forward, backward, all-reduce and update at its place
// on the time axis, text escaped.
#include "h2/scheduler/timeline_svg.hpp"

#include "h2/core/error.hpp"

#include <gtest/gtest.h>

#include <string>

namespace h2::scheduler {
namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1))
    ++n;
  return n;
}

simulated_pipeline two_stages(schedule_kind kind, int micro_batches) {
  simulated_pipeline p;
  p.kind = kind;
  p.micro_batches = micro_batches;
  for (int s = 0; s < 2; ++s) {
    simulated_stage st;
    st.forward_seconds = 1;
    st.backward_seconds = 2;
    st.optimizer_seconds = 0.5;
    p.stages.push_back(st);
  }
  return p;
}

TEST(scheduler_timeline_svg, a_bar_per_interval_in_its_row) {
  // Two replicas of two stages, 3 micro-batches, all-reducing stage by
  // stage: 2 x 2 x 3 x 2 computes, 4 all-reduce bars, 4 updates.
  auto p = two_stages(schedule_kind::gpipe, 3);
  auto sim =
    simulate({p, p}, {{{{0, 0}, {1, 0}}, 1.0}, {{{0, 1}, {1, 1}}, 1.0}}, true);
  auto svg =
    render_svg(sim, {{"0:0 a<b", "0:1 c&d"}, {"1:0 e", "1:1 f"}}, "step \"x\"");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_EQ(svg.find("</svg>"), svg.size() - 7);
  EXPECT_NE(svg.find(">0:0 a&lt;b<"), std::string::npos);
  EXPECT_NE(svg.find(">0:1 c&amp;d<"), std::string::npos);
  EXPECT_NE(svg.find("step &quot;x&quot;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(count(svg, "<title>forward "), 12u);
  EXPECT_EQ(count(svg, "<title>backward "), 12u);
  EXPECT_EQ(count(svg, "<title>allreduce<"), 4u);
  EXPECT_EQ(count(svg, "<title>optimizer<"), 4u);
  // Rows: replica 1's second stage is the fourth row (y = 56 + 3 x 22 + 3).
  EXPECT_NE(svg.find(">1:1 f<"), std::string::npos);
  std::size_t last_row_bars = count(svg, "y=\"125.00\" width=");
  // Its idle background, 6 computes, an all-reduce and an update.
  EXPECT_EQ(last_row_bars, 1u + 6u + 1u + 1u);
  // The axis spans the step: its last tick is at most the step's end.
  EXPECT_NE(svg.find(">0 s<"), std::string::npos);
}

TEST(scheduler_timeline_svg, labels_must_match_the_simulation) {
  auto sim = simulate({two_stages(schedule_kind::one_f_one_b, 2)}, {}, true);
  EXPECT_THROW(render_svg(sim, {{"only one"}}, "t"), internal_error);
  EXPECT_THROW(render_svg(sim, {}, "t"), internal_error);
}

} // namespace
} // namespace h2::scheduler
