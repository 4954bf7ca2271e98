// run_view: what the live page shows, recorded from observer callbacks.
#include "h2/runtime/run_view.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <thread>

namespace h2::runtime {
namespace {

/// A step of the demo's plan: chips on positions 0..n-1 of replica 0, each
/// waiting, then a forward of 1 s after its position, and an update.
step_summary demo_step(const plan& p, int step, double loss) {
  step_summary s;
  s.step = step;
  s.loss = loss;
  s.tokens_per_second = 1000 + step;
  s.step_seconds = 10;
  s.pipeline_seconds = 8;
  const auto& r = p.replicas.front();
  for (std::size_t i = 0; i < r.stages.size(); ++i) {
    chip_step_stats c;
    c.chip = r.stages[i].chip;
    c.stage = static_cast<int>(i);
    c.forward_seconds = 1;
    c.backward_seconds = 2;
    c.optimizer_seconds = 1;
    c.idle_seconds = 2;
    c.memory = {100, 200, 1000};
    s.chips.push_back(c);
    const double t0 = 100 + static_cast<double>(i);
    s.ops.push_back({c.chip, {recorded_op::recv_forward, 0, 100, t0, 0, 0}});
    s.ops.push_back({c.chip, {recorded_op::forward, 0, t0, t0 + 1, 1, 0}});
    s.ops.push_back({c.chip, {recorded_op::optimizer, 0, 105, 110, 1, 0}});
  }
  return s;
}

struct run_view_fixture : ::testing::Test {
  job_config job = parse_job(demo_job_toml(), "demo.toml");
  plan p = scheduler::make_plan(job);
};

TEST_F(run_view_fixture, the_state_names_every_chip_of_the_plan) {
  run_view view(job, 20);
  auto before = nlohmann::json::parse(view.state_json());
  EXPECT_EQ(before["status"], "starting");
  EXPECT_TRUE(before["plan"].empty());
  EXPECT_FALSE(view.timeline_svg());

  view.on_setup(p, {});
  view.on_step(demo_step(p, 0, 5.5));
  auto j = nlohmann::json::parse(view.state_json());
  EXPECT_EQ(j["job"], job.name);
  EXPECT_EQ(j["status"], "training");
  EXPECT_EQ(j["steps_done"], 1);
  EXPECT_EQ(j["total_steps"], 20);
  EXPECT_EQ(j["timeline_step"], 1);
  const auto& stages = j["plan"][0]["stages"];
  ASSERT_EQ(stages.size(), p.replicas[0].stages.size());
  ASSERT_EQ(j["chips"].size(), stages.size());
  for (std::size_t i = 0; i < stages.size(); ++i) {
    EXPECT_EQ(stages[i]["chip"], p.replicas[0].stages[i].chip.to_string());
    EXPECT_EQ(j["chips"][i]["chip"], stages[i]["chip"]);
    EXPECT_DOUBLE_EQ(j["chips"][i]["utilisation"].get<double>(), 0.4);
    EXPECT_DOUBLE_EQ(j["chips"][i]["bubble"].get<double>(), 0.25);
    EXPECT_EQ(j["chips"][i]["memory"]["capacity_bytes"], 1000);
  }
  EXPECT_EQ(j["last"]["loss"], 5.5);
  EXPECT_EQ(j["history"]["loss"], nlohmann::json::array({5.5}));
  EXPECT_EQ(j["events"][0]["kind"], "plan");

  view.finish({});
  EXPECT_EQ(nlohmann::json::parse(view.state_json())["status"], "done");
}

TEST_F(run_view_fixture, long_runs_keep_evenly_spaced_points) {
  // From the start, and resumed from a checkpoint at an odd step.
  for (const int first : {0, 201}) {
    run_view view(job, 100000);
    view.on_setup(p, {});
    const int steps = static_cast<int>(run_view::max_points) * 5 / 2;
    for (int i = first; i < first + steps; ++i)
      view.on_step(demo_step(p, i, 10.0 - i * 1e-3));
    auto j = nlohmann::json::parse(view.state_json());
    EXPECT_EQ(j["steps_done"], first + steps); // the run's step, not ours
    const auto points = j["history"]["step"].get<std::vector<int>>();
    EXPECT_LT(points.size(), run_view::max_points);
    EXPECT_GT(points.size(), run_view::max_points / 2);
    ASSERT_GE(points.size(), 3u);
    EXPECT_EQ(points.front(), first + 1);
    for (std::size_t i = 1; i < points.size(); ++i)
      EXPECT_EQ(points[i] - points[i - 1], 4) << first << " " << i;
    EXPECT_EQ(j["history"]["loss"].size(), points.size());
  }
}

TEST_F(run_view_fixture, events_are_bounded_and_newest_last) {
  run_view view(job, 1000);
  view.on_setup(p, {});
  for (int i = 0; i < static_cast<int>(run_view::max_events) + 10; ++i)
    view.on_checkpoint(i, 0.1, 0.2);
  rebalance_event e;
  e.step = 7;
  e.generation = 1;
  e.reason = "admin <b>";
  e.value = p;
  e.moves = {"layers [3, 5) 0:1 -> 0:2"};
  view.on_rebalance(e);
  auto events = nlohmann::json::parse(view.state_json())["events"];
  ASSERT_EQ(events.size(), run_view::max_events);
  EXPECT_EQ(events.back()["kind"], "rebalance");
  EXPECT_NE(events.back()["text"].get<std::string>().find(
              "admin <b> | layers [3, 5) 0:1 -> 0:2"),
            std::string::npos);
  EXPECT_EQ(events.front()["step"], 11); // the oldest were dropped
}

TEST_F(run_view_fixture, the_timeline_draws_each_chip_on_its_row) {
  const auto s = demo_step(p, 3, 4.0);
  const auto sim = measured_timeline(s);
  ASSERT_EQ(sim.replicas.size(), 1u);
  ASSERT_EQ(sim.replicas[0].size(), p.replicas[0].stages.size());
  EXPECT_DOUBLE_EQ(sim.step_seconds, 10); // 100 .. 110
  // Waits are not drawn; a forward and an update per chip.
  ASSERT_EQ(sim.timeline.size(), 2 * p.replicas[0].stages.size());
  for (const auto& iv : sim.timeline) {
    if (iv.kind == scheduler::interval_kind::forward) {
      EXPECT_DOUBLE_EQ(iv.start_seconds, iv.stage);
      EXPECT_EQ(iv.micro_batch, 0);
    } else {
      EXPECT_EQ(iv.kind, scheduler::interval_kind::optimizer);
      EXPECT_EQ(iv.micro_batch, -1);
      EXPECT_DOUBLE_EQ(iv.start_seconds, 5);
    }
  }

  run_view view(job, 10);
  view.on_setup(p, {});
  view.on_step(s);
  const auto svg = view.timeline_svg();
  ASSERT_TRUE(svg);
  EXPECT_NE(svg->find("step 4 as measured"), std::string::npos);
  for (const auto& st : p.replicas[0].stages)
    EXPECT_NE(svg->find(">" + st.chip.to_string() + " "), std::string::npos);
  // A step whose ops were not recorded (another node's copy) has none.
  auto slim = s;
  slim.ops.clear();
  view.on_step(slim);
  EXPECT_FALSE(view.timeline_svg());
}

// The HTTP server's threads read while the scheduler's thread records (the
// TSan stage runs this).
TEST_F(run_view_fixture, readers_on_other_threads_see_whole_steps) {
  run_view view(job, 400);
  view.on_setup(p, {});
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r)
    readers.emplace_back([&] {
      while (!done) {
        auto j = nlohmann::json::parse(view.state_json());
        // A step is recorded whole: its loss and its point go together.
        if (j.contains("last")) {
          EXPECT_EQ(j["last"]["loss"], j["history"]["loss"].back());
        }
        (void)view.timeline_svg();
      }
    });
  for (int i = 0; i < 400; ++i)
    view.on_step(demo_step(p, i, 1.0 + i));
  done = true;
  for (auto& t : readers)
    t.join();
  EXPECT_EQ(nlohmann::json::parse(view.state_json())["steps_done"], 400);
}

} // namespace
} // namespace h2::runtime
