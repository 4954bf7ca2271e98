// ZeRO-1 (docs/planner.md, "Sharded optimizer state"): each reduction
// group's AdamW moments split across its members, the gradients
// reduce-scattered and the updated parameters all-gathered. The sums are
// the all-reduce's own and AdamW is element-wise, so a sharded run equals
// the unsharded one bit for bit in fp32, also over replicas cut at
// different boundaries, with tied embeddings and with interleaved chunks;
// each chip keeps exactly its share of the moments, and a forced live move
// of layers changes nothing.
#include "h2/actors/local_job.hpp"
#include "h2/core/model_config.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <cstring>

namespace h2::test {
namespace {

/// Six fp32 chips of four kinds, 6 layers, 8 sequences, virtual clock; one
/// all-reduce bucket per group unless `bucket_mb` is given.
job_config zero1_job(const std::string& bucket_mb = "64") {
  auto j = parse_job(small_job_toml(23) + R"(
[transport]
bucket_mb = )" + bucket_mb +
                       R"(
[[nodes]]
chips = [{device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:mi250x", dtype = "fp32"},
         {device = "emulated:a100-sxm-80gb", dtype = "fp32"},
         {device = "emulated:mi300x", dtype = "fp32"},
         {device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:a100-sxm-40gb", dtype = "fp32"}]
)",
                     "zero1.toml");
  j.train.steps = 4;
  return j;
}

stage_plan on(int chip, int first, int end) {
  return stage_plan{chip_id{0, chip}, first, end, false};
}

/// Three replicas cut at different boundaries: [0,4)+[4,6) of 2x2
/// sequences, [0,1)+[1,3)+[3,6) of 1x2, one chip of 1x2.
plan three_replicas(bool zero1) {
  plan p;
  p.schedule = schedule_kind::gpipe;
  p.replicas = {{{on(0, 0, 4), on(1, 4, 6)}, 2, 2},
                {{on(2, 0, 1), on(3, 1, 3), on(4, 3, 6)}, 1, 2},
                {{on(5, 0, 6)}, 1, 2}};
  p.zero1 = zero1;
  return p;
}

struct zero1_run {
  std::vector<double> losses;
  std::vector<runtime::parameter_values> params; ///< replica 0's
  std::map<chip_id, std::vector<runtime::parameter_values>> by_chip;
  std::vector<runtime::step_summary> steps;
};

zero1_run train(const job_config& job, const plan& p,
                std::map<int, plan> replans = {}) {
  validate_plan(p, job, "plan");
  actors::local_job local(std::make_shared<job_config>(job), p);
  runtime::step_recorder obs;
  actors::run_options o(job.train.steps, true);
  o.replans = std::move(replans);
  local.run(o, obs);
  zero1_run out{obs.losses(), local.parameters(), {}, obs.steps};
  for (const auto& r : p.replicas)
    for (const auto& s : r.stages)
      out.by_chip[s.chip] = local.parameters_of(s.chip);
  return out;
}

void expect_same_values(const std::vector<runtime::parameter_values>& a,
                        const std::vector<runtime::parameter_values>& b,
                        const std::string& where) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].values.size(), b[i].values.size());
    EXPECT_EQ(0, std::memcmp(a[i].values.data(), b[i].values.data(),
                             a[i].values.size() * sizeof(float)))
      << a[i].name << where;
  }
}

/// The same losses and the same parameters on every chip, bit for bit.
void expect_bitwise(const zero1_run& a, const zero1_run& b) {
  EXPECT_EQ(a.losses, b.losses);
  ASSERT_EQ(a.by_chip.size(), b.by_chip.size());
  for (const auto& [chip, params] : a.by_chip)
    expect_same_values(params, b.by_chip.at(chip), " on " + chip.to_string());
}

TEST(actors_zero1, sharded_equals_unsharded_bitwise_over_uneven_replicas) {
  // Tiny buckets: a group's parameters travel in several, each sharded.
  const auto job = zero1_job("0.001");
  EXPECT_GT(reduction_groups(three_replicas(true)).size(), 2u);
  expect_bitwise(train(job, three_replicas(true)),
                 train(job, three_replicas(false)));
}

TEST(actors_zero1, tied_embeddings_and_interleaved_chunks_stay_bitwise) {
  auto job = zero1_job();
  job.model.tie_embeddings = true;
  expect_bitwise(train(job, three_replicas(true)),
                 train(job, three_replicas(false)));
  // A chip's layers in two chunks, every layer its own group.
  plan p;
  p.schedule = schedule_kind::interleaved_1f1b;
  p.replicas = {{{on(0, 0, 2), on(1, 2, 3), on(0, 3, 5), on(1, 5, 6)}, 2, 2},
                {{on(2, 0, 1), on(3, 1, 3), on(2, 3, 4), on(3, 4, 6)}, 2, 2}};
  job.model.tie_embeddings = false;
  plan sharded = p;
  sharded.zero1 = true;
  expect_bitwise(train(job, sharded), train(job, p));
}

// Each chip keeps the moments of its ring share of each group: of n
// elements over R replicas (one bucket here), member r keeps share
// (r + 1) mod R, n / R elements (one more for the first n mod R shares).
// Its step's peak (h2_chip_memory_peak_bytes) falls by 8 bytes per element
// it does not keep. One chip per replica and long sequences put the peak
// in the backward, where no message is in flight to blur it.
TEST(actors_zero1, each_chip_keeps_its_share_of_the_moments) {
  auto job = zero1_job();
  job.model.seq_len = 64;
  plan p;
  p.zero1 = true;
  p.replicas = {
    {{on(0, 0, 6)}, 3, 1}, {{on(1, 0, 6)}, 3, 1}, {{on(2, 0, 6)}, 2, 1}};
  plan unsharded = p;
  unsharded.zero1 = false;
  const auto sharded = train(job, p);
  const auto whole = train(job, unsharded);
  std::int64_t n = 0;
  for (int l = 0; l < job.model.num_layers(); ++l)
    n += layer_parameters(job.model, l);
  const auto& a = sharded.steps.back().chips;
  const auto& b = whole.steps.back().chips;
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (std::int64_t r = 0; r < 3; ++r) {
    const std::int64_t share = (r + 1) % 3;
    const std::int64_t kept = n / 3 + (share < n % 3 ? 1 : 0);
    const auto i = static_cast<std::size_t>(r);
    EXPECT_EQ(b[i].memory.peak - a[i].memory.peak,
              static_cast<std::uint64_t>(8 * (n - kept)))
      << a[i].chip.to_string();
  }
}

// A live re-plan under ZeRO-1 (docs/rebalance.md): the chips gather their
// moments for the move, each takes its new share; forced moves at two
// steps leave the run bitwise the one without them.
TEST(actors_zero1, forced_moves_train_as_if_the_layers_never_moved) {
  const auto job = zero1_job();
  plan start;
  start.zero1 = true;
  start.replicas = {{{on(0, 0, 3), on(1, 3, 6)}, 2, 2},
                    {{on(2, 0, 3), on(3, 3, 6)}, 2, 2}};
  // The rings keep their chips (a live re-plan keeps every channel).
  plan moved = start, back = start;
  moved.replicas[0].stages = {on(0, 0, 2), on(1, 2, 6)};
  moved.replicas[1].stages = {on(2, 0, 2), on(3, 2, 6)};
  back.replicas[0].stages = {on(0, 0, 4), on(1, 4, 6)};
  back.replicas[1].stages = {on(2, 0, 4), on(3, 4, 6)};
  const auto with_moves = train(job, start, {{1, moved}, {3, back}});
  const auto without = train(job, start);
  EXPECT_EQ(with_moves.losses, without.losses);
  expect_same_values(with_moves.params, without.params, "");
}

} // namespace
} // namespace h2::test
