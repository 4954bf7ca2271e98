// docs/architecture.md, "Correctness anchors": on data from a known Markov source the
// validation loss approaches the bound computed exactly from the source.
#include "reference_run.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

namespace h2::test {
namespace {

TEST(actors_learning, validation_loss_reaches_the_markov_bound) {
  // 16 states + BOS; H = 1.0 nats <= ln(17) / 2 = 1.42. Two pipeline stages
  // on chips of two vendors, virtual clock.
  const std::string toml = "[job]\nseed = 3\n" +
                           model_toml(17, 16, 64, 4, 2) + R"(
[train]
steps = 250
global_batch = 32
micro_batch = 8
lr = 1e-2
min_lr = 1e-3
warmup_steps = 10
weight_decay = 0.0
grad_clip = 1.0
eval_every = 250
eval_batches = 32
[emulation]
clock = "virtual"
[[nodes]]
chips = [{device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:mi250x", dtype = "fp32"}]
)";
  auto job = parse_job(toml, "markov.toml");
  ASSERT_LE(job.data.entropy_rate, 0.5 * std::log(job.model.vocab_size));
  model::markov_source source(job.model.vocab_size, job.model.seq_len,
                              job.data.entropy_rate, job.seed);
  const double t = job.model.seq_len;
  const double bound =
    ((t - 1) * job.data.entropy_rate + source.stationary_entropy()) / t;
  ASSERT_DOUBLE_EQ(bound, source.achievable_loss());

  recording_observer obs;
  auto summary = run_job(job, obs);
  ASSERT_FALSE(obs.val_losses.empty());
  const double val = obs.val_losses.back();
  // 32 x 32 x 16 = 16384 validation tokens: the estimate's standard error
  // is about 0.01 nats, well inside the 0.05 the test allows.
  std::printf("validation loss %.4f, bound %.4f, first training loss %.4f\n",
              val, bound, obs.steps.front().loss);
  EXPECT_NEAR(val, bound, 0.05)
    << "bound " << bound << ", first loss " << obs.steps.front().loss;
  EXPECT_LT(summary.final_loss, obs.steps.front().loss);
}

} // namespace
} // namespace h2::test
