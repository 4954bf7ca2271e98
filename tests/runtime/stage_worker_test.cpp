// The stage worker without an actor system: two stage_workers on threads of
// their own, wired over in-process channels by the same functions the jobs
// use (assign_links, wire_channels), run one step of 1F1B and its update.
// The result equals the same step through actors (local_job) bit for bit.
#include "h2/actors/local_job.hpp"
#include "h2/runtime/links.hpp"
#include "h2/runtime/stage_worker.hpp"
#include "h2/runtime/step_control.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <memory>
#include <vector>

namespace h2::runtime {
namespace {

std::shared_ptr<job_config> two_stage_job() {
  auto job =
    std::make_shared<job_config>(parse_job(test::small_job_toml(5) + R"(
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x"]
[plan]
mode = "manual"
schedule = "1f1b"
stages = ["0:0", "0:1"]
layers = [3, 3]
)",
                                           "two-stages.toml"));
  job->train.steps = 1;
  return job;
}

/// What a run left behind.
struct trained {
  std::vector<double> losses;
  std::vector<parameter_values> params; ///< in global layer order
};

/// The steps through chip actors and the scheduler actor.
trained through_actors(const std::shared_ptr<job_config>& job, int steps) {
  actors::local_job local(job, scheduler::make_plan(*job));
  step_recorder recorder;
  local.run({steps, true}, recorder);
  return {recorder.losses(), local.parameters()};
}

/// A plan's stage workers driven from this test's threads, wired by the
/// functions the jobs use. Each worker is built and steps on a thread of
/// its own (the stages wait on each other), as chip actors do.
class pipeline {
public:
  pipeline(std::shared_ptr<job_config> job, plan p)
      : job_(std::move(job)), plan_(std::move(p)) {
    auto setups = make_worker_setups(
      job_, plan_, devices::chip_clock::wall_clock::now(), cancel_);
    std::map<int, transport::endpoint_address> here{{0, {}}};
    wire_channels(setups, assign_links(plan_, here, "")[0], *job_, nullptr,
                  transport::deadline::max(),
                  [&](const std::shared_ptr<transport::channel>& ch) {
                    channels_.push_back(ch);
                  });
    workers_.resize(setups.size());
    on_every_worker([&](std::size_t i) {
      workers_[i] = std::make_unique<stage_worker>(setups[i]);
      return 0;
    });
  }

  std::size_t channels() const { return channels_.size(); }

  /// One step and its update; returns the step's loss.
  double step(int step) {
    auto reports = on_every_worker(
      [&](std::size_t i) { return workers_[i]->run_step({step, 0.0}); });
    const auto decision = decide_update(*job_, step, reports);
    double loss = 0;
    for (const auto& r : reports)
      loss += r.loss;
    for (auto& w : workers_)
      w->apply_update(decision.command);
    return loss;
  }

  std::vector<layer_state> snapshot() {
    std::vector<layer_state> out;
    for (auto& w : workers_)
      for (auto& s : w->snapshot())
        out.push_back(std::move(s));
    return out;
  }

  void restore(const std::vector<layer_state>& states) {
    for (auto& w : workers_)
      w->restore(states);
  }

  /// Every parameter, gradient and AdamW moment of every stage lives on
  /// its chip (device_context::holds: its device, and charged to its
  /// memory). `moments`: the optimizer has run.
  void expect_on_their_chips(bool moments) const {
    for (const auto& w : workers_) {
      auto& device = w->device();
      for (auto* l : w->layers())
        for (auto& param : l->parameters()) {
          const auto* p = &param;
          SCOPED_TRACE(device.describe() + " " + p->name);
          EXPECT_TRUE(device.holds(p->value));
          EXPECT_EQ(p->value.device(), device.torch_device());
          if (p->value.grad().defined()) {
            EXPECT_TRUE(device.holds(p->value.grad()));
          }
          EXPECT_EQ(p->exp_avg.defined(), moments);
          if (moments) {
            EXPECT_TRUE(device.holds(p->exp_avg));
            EXPECT_TRUE(device.holds(p->exp_avg_sq));
          }
        }
    }
  }

  std::vector<parameter_values> parameters() const {
    std::vector<parameter_values> out;
    for (const auto& w : workers_) {
      auto ps = w->parameters();
      out.insert(out.end(), ps.begin(), ps.end());
    }
    return out;
  }

private:
  template <class F>
  auto on_every_worker(F f) -> std::vector<decltype(f(0))> {
    std::vector<std::future<decltype(f(0))>> running;
    for (std::size_t i = 0; i < workers_.size(); ++i)
      running.push_back(std::async(std::launch::async, f, i));
    std::vector<decltype(f(0))> out;
    for (auto& r : running)
      out.push_back(r.get());
    return out;
  }

  std::shared_ptr<job_config> job_;
  plan plan_;
  std::shared_ptr<cancellation> cancel_ = std::make_shared<cancellation>();
  std::vector<std::shared_ptr<transport::channel>> channels_;
  std::vector<std::unique_ptr<stage_worker>> workers_;
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_bitwise(const std::vector<parameter_values>& got,
                    const std::vector<parameter_values>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  ASSERT_FALSE(got.empty());
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(got[i].name);
    EXPECT_EQ(got[i].name, expected[i].name);
    EXPECT_EQ(got[i].shape, expected[i].shape);
    EXPECT_TRUE(bitwise_equal(got[i].values, expected[i].values));
  }
}

TEST(runtime_stage_worker, one_1f1b_step_without_actors_equals_actors) {
  auto job = two_stage_job();
  const auto expected = through_actors(job, 1);
  pipeline p(job, scheduler::make_plan(*job));
  EXPECT_EQ(p.channels(), 2u); // one in-process pair
  const double loss = p.step(0);
  EXPECT_EQ(loss, expected.losses.at(0)); // bitwise: same ops, same order
  EXPECT_GT(loss, 0);
  expect_bitwise(p.parameters(), expected.params);
}

TEST(runtime_stage_worker, state_moves_to_another_plan_and_training_goes_on) {
  // Two steps in one go, against one step under layers [3, 3], the state
  // of every layer, and the second step under layers [2, 4].
  auto job = two_stage_job();
  job->train.steps = 2;
  const auto expected = through_actors(job, 2);
  std::vector<layer_state> states;
  {
    pipeline first(job, scheduler::make_plan(*job));
    EXPECT_EQ(first.step(0), expected.losses.at(0));
    states = first.snapshot();
  }
  ASSERT_EQ(states.size(), 6u);
  for (const auto& s : states) // moments after the first update
    EXPECT_EQ(s.tensors.size() % 3, 0u) << "layer " << s.layer;
  plan other = scheduler::make_plan(*job);
  other.replicas[0].stages[0].end_layer = 2;
  other.replicas[0].stages[1].first_layer = 2;
  pipeline second(job, other);
  second.restore(states);
  EXPECT_EQ(second.step(1), expected.losses.at(1));
  expect_bitwise(second.parameters(), expected.params);
}

TEST(runtime_stage_worker, every_tensor_of_a_stage_lives_on_its_chip) {
  // Parameters, gradients and moments are checked here; batches, received
  // activations and gradients and forward outputs by the worker itself at
  // every op (an internal_error naming the chip would fail the step).
  auto job = two_stage_job();
  job->train.steps = 3;
  std::vector<layer_state> states;
  {
    pipeline p(job, scheduler::make_plan(*job));
    p.expect_on_their_chips(false);
    p.step(0);
    p.expect_on_their_chips(true);
    states = p.snapshot();
  }
  {
    SCOPED_TRACE("resumed under the same plan");
    pipeline resumed(job, scheduler::make_plan(*job));
    resumed.restore(states);
    resumed.expect_on_their_chips(true);
    resumed.step(1);
    resumed.expect_on_their_chips(true);
  }
  {
    SCOPED_TRACE("a layer moved to the other chip");
    plan other = scheduler::make_plan(*job);
    other.replicas[0].stages[0].end_layer = 4;
    other.replicas[0].stages[1].first_layer = 4;
    pipeline moved(job, other);
    moved.restore(states);
    moved.expect_on_their_chips(true);
    moved.step(1);
    moved.expect_on_their_chips(true);
  }
}

TEST(runtime_stage_worker, a_state_that_does_not_fit_is_refused) {
  auto job = two_stage_job();
  pipeline p(job, scheduler::make_plan(*job));
  auto states = p.snapshot();
  ASSERT_FALSE(states.empty());
  auto missing = states;
  missing.pop_back(); // the head's state
  EXPECT_THROW(p.restore(missing), checkpoint_error);
  auto reshaped = states;
  reshaped[1].tensors[0].shape.push_back(1);
  try {
    p.restore(reshaped);
    FAIL() << "expected a mismatch";
  } catch (const checkpoint_error& e) {
    EXPECT_EQ(e.kind(), checkpoint_errc::mismatch);
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos)
      << e.what();
  }
}

TEST(runtime_stage_worker, closing_a_channel_fails_the_waiting_neighbour) {
  auto job = two_stage_job();
  const plan p = scheduler::make_plan(*job);
  auto setups =
    make_worker_setups(job, p, devices::chip_clock::wall_clock::now(),
                       std::make_shared<cancellation>());
  std::map<int, transport::endpoint_address> here{{0, {}}};
  wire_channels(setups, assign_links(p, here, "")[0], *job, nullptr,
                transport::deadline::max(), nullptr);
  // Stage 1 waits for activations that never come: stage 0 closes instead.
  stage_worker last(setups[1]);
  auto waiting = std::async(std::launch::async, [&] {
    return last.run_step({0, 0.0});
  });
  setups[0].close_channels();
  EXPECT_THROW(waiting.get(), transport_error);
}

} // namespace
} // namespace h2::runtime
