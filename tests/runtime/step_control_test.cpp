// The scheduler's arithmetic between the phases of a step, without the
// actor: the update decision, when validation is due, the run's totals.
#include "h2/core/error.hpp"
#include "h2/model/optim.hpp"
#include "h2/runtime/step_control.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace h2::runtime {
namespace {

job_config small_job() {
  return parse_job(test::small_job_toml(1) +
                     "[[nodes]]\nchips = [\"emulated:h100-sxm\"]\n",
                   "small.toml");
}

chip_step_report norms(int replica, int first_layer, std::vector<double> sq,
                       double phase_end) {
  chip_step_report r;
  r.replica = replica;
  r.first_layer = first_layer;
  for (std::size_t i = 0; i < sq.size(); ++i)
    r.layer_ids.push_back(first_layer + static_cast<int>(i));
  r.layer_squared_norms = std::move(sq);
  r.phase_end.virtual_seconds = phase_end;
  r.loss = 0.25;
  return r;
}

TEST(runtime_step_control, update_follows_the_norm_and_the_schedule) {
  const auto job = small_job();
  // Replica 1 holds the same gradients after the all-reduce: not counted.
  auto d = decide_update(
    job, 2,
    {norms(0, 3, {9}, 4.0), norms(0, 0, {16}, 5.0), norms(1, 0, {100}, 7.0)});
  EXPECT_DOUBLE_EQ(d.grad_norm, 5.0);
  EXPECT_EQ(d.command.step, 2);
  EXPECT_DOUBLE_EQ(d.command.clip_coefficient,
                   model::clip_coefficient(5.0, job.train.grad_clip));
  EXPECT_LT(d.command.clip_coefficient, 1.0); // grad_clip = 0.5
  EXPECT_DOUBLE_EQ(d.command.lr, model::learning_rate(job.train, 2));
  EXPECT_DOUBLE_EQ(d.command.virtual_barrier, 7.0);
}

TEST(runtime_step_control, a_non_finite_norm_stops_the_run) {
  const auto job = small_job();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  try {
    decide_update(job, 4, {norms(0, 0, {nan}, 1.0)});
    FAIL() << "expected an error";
  } catch (const h2::error& e) {
    EXPECT_NE(std::string(e.what()).find("step 5"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos);
  }
}

TEST(runtime_step_control, validation_every_n_steps_and_at_the_end) {
  auto job = small_job();
  job.train.eval_every = 3;
  EXPECT_FALSE(eval_due(job, 1, 7));
  EXPECT_TRUE(eval_due(job, 3, 7));
  EXPECT_TRUE(eval_due(job, 6, 7));
  EXPECT_TRUE(eval_due(job, 7, 7)); // the last step
  job.train.eval_every = 0;
  EXPECT_FALSE(eval_due(job, 7, 7));
}

step_summary step(int index, double seconds, double bubble) {
  step_summary s;
  s.step = index;
  s.loss = 1.0 / (index + 1);
  s.step_seconds = seconds;
  s.bubble_fraction = bubble;
  s.virtual_end = 10.0 * (index + 1);
  return s;
}

TEST(runtime_step_control, totals_leave_the_warm_up_step_out) {
  run_totals totals(3);
  chip_update_report u;
  u.end.wall_seconds = 2.5;
  totals.add(step(0, 100.0, 0.5), {u}, 64); // warm-up: not averaged
  totals.add(step(1, 2.0, 0.25), {u}, 64);
  totals.add(step(2, 4.0, 0.0), {u}, 64);
  totals.add_eval(1.5);
  auto s = totals.summary(false);
  EXPECT_EQ(s.steps, 3);
  EXPECT_FALSE(s.stopped_early);
  EXPECT_DOUBLE_EQ(s.mean_step_seconds, 3.0);
  EXPECT_DOUBLE_EQ(s.tokens_per_second, 128.0 / 6.0);
  EXPECT_DOUBLE_EQ(s.mean_bubble_fraction, 0.25);
  EXPECT_DOUBLE_EQ(s.final_loss, 1.0 / 3);
  EXPECT_DOUBLE_EQ(s.final_val_loss, 1.5);
  EXPECT_DOUBLE_EQ(s.virtual_seconds, 30.0);
  EXPECT_DOUBLE_EQ(s.wall_seconds, 2.5);

  run_totals single(1); // a one-step run times its only step
  single.add(step(0, 7.0, 0.0), {u}, 64);
  EXPECT_DOUBLE_EQ(single.summary(true).mean_step_seconds, 7.0);
  EXPECT_TRUE(single.summary(true).stopped_early);
}

} // namespace
} // namespace h2::runtime
