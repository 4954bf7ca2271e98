// Data-parallel replicas (docs/architecture.md): R pipelines, possibly of different
// chips, partitions and micro-batch counts, whose gradients are summed by a
// ring all-reduce, equal one chip training over the same global batch.
#include "reference_run.hpp"
#include "test_jobs.hpp"

#include "h2/core/plan.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace h2::test {
namespace {

/// Six chips of three kinds, fp32, virtual clock; 6 layers, 8 sequences.
const std::string replica_job = small_job_toml(11) + R"(
[transport]
bucket_mb = 0.001
[[nodes]]
chips = [{device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:mi250x", dtype = "fp32"},
         {device = "emulated:a100-sxm-80gb", dtype = "fp32"},
         {device = "emulated:mi300x", dtype = "fp32"},
         {device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:a100-sxm-40gb", dtype = "fp32"}]
)";

stage_plan stage(int chip, int first, int end) {
  return stage_plan{chip_id{0, chip}, first, end, false};
}

struct replica_run {
  std::vector<double> losses;
  std::vector<runtime::parameter_values> params;
  std::map<chip_id, std::vector<runtime::parameter_values>> by_chip;
};

replica_run run(const job_config& job, const plan& p) {
  auto shared = std::make_shared<job_config>(job);
  actors::local_job local(shared, p);
  runtime::step_recorder obs;
  local.run({job.train.steps, true}, obs);
  replica_run out{obs.losses(), local.parameters(), {}};
  for (const auto& r : p.replicas)
    for (const auto& s : r.stages)
      out.by_chip[s.chip] = local.parameters_of(s.chip);
  return out;
}

/// The bound for replicas against one chip. Only the order in which the
/// micro-batches' gradient contributions are added differs (per replica,
/// then across replicas, instead of one running sum): a reassociation of a
/// few fp32 terms, relative error ~1e-7 per gradient. The loss of a step is
/// a sum of the same terms in another order too. AdamW amplifies tiny
/// gradient differences only where a gradient is near zero, and even there
/// moves a parameter by at most about lr per step: the worst case is 2 lr
/// per step; the mean difference stays orders of magnitude below it.
void expect_close_to_reference(const job_config& job, const replica_run& r) {
  auto ref = train_reference(job, schedule_kind::one_f_one_b, 1);
  ASSERT_EQ(r.losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_NEAR(r.losses[i], ref.losses[i], 1e-5 * ref.losses[i])
      << "step " << i;
  ASSERT_EQ(r.params.size(), ref.params.size());
  double max_diff = 0, sum_diff = 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < ref.params.size(); ++i) {
    ASSERT_EQ(r.params[i].name, ref.params[i].name);
    for (std::size_t j = 0; j < ref.params[i].values.size(); ++j) {
      double d = std::abs(static_cast<double>(r.params[i].values[j]) -
                          ref.params[i].values[j]);
      max_diff = std::max(max_diff, d);
      sum_diff += d;
      ++n;
    }
  }
  EXPECT_LE(max_diff, 2 * job.train.lr * job.train.steps);
  EXPECT_LE(sum_diff / static_cast<double>(n), 1e-4 * job.train.lr);
}

/// After the all-reduce every replica applies the same update: chips that
/// hold the same layers hold bitwise the same parameters.
void expect_replicas_identical(const replica_run& r, const plan& p) {
  std::map<std::string, const runtime::parameter_values*> first;
  for (const auto& [chip, params] : r.by_chip)
    for (const auto& v : params) {
      auto [it, fresh] = first.emplace(v.name, &v);
      if (fresh)
        continue;
      ASSERT_EQ(v.values.size(), it->second->values.size());
      EXPECT_EQ(0, std::memcmp(v.values.data(), it->second->values.data(),
                               v.values.size() * sizeof(float)))
        << v.name << " differs between replicas";
    }
  EXPECT_EQ(first.size(), r.params.size());
}

TEST(actors_replicas, two_equal_replicas_equal_one_chip) {
  auto job = parse_job(replica_job, "replicas.toml");
  plan p;
  p.schedule = schedule_kind::one_f_one_b;
  p.replicas = {{{stage(0, 0, 3), stage(1, 3, 6)}, 2, 2},
                {{stage(2, 0, 3), stage(3, 3, 6)}, 2, 2}};
  validate_plan(p, job, "plan");
  ASSERT_EQ(reduction_groups(p).size(), 2u);
  auto r = run(job, p);
  expect_close_to_reference(job, r);
  expect_replicas_identical(r, p);
}

/// Replica 0: two stages, three micro-batches of 2 sequences; replica 1:
/// three stages cut elsewhere, one micro-batch of 2; replica 2: one chip.
plan three_heterogeneous_replicas() {
  plan p;
  p.schedule = schedule_kind::gpipe;
  p.replicas = {{{stage(0, 0, 4), stage(1, 4, 6)}, 2, 2},
                {{stage(2, 0, 1), stage(3, 1, 3), stage(4, 3, 6)}, 1, 2},
                {{stage(5, 0, 6)}, 1, 2}};
  return p;
}

TEST(actors_replicas, heterogeneous_replicas_equal_one_chip) {
  auto job = parse_job(replica_job, "replicas.toml");
  const plan p = three_heterogeneous_replicas();
  validate_plan(p, job, "plan");
  EXPECT_GT(reduction_groups(p).size(), 2u); // boundaries differ
  auto r = run(job, p);
  expect_close_to_reference(job, r);
  expect_replicas_identical(r, p);
}

// Tied embeddings over three replicas cut differently: after the
// all-reduce each replica's end chips sum the tied gradient, so every copy
// of the table, on every chip, is bitwise the same.
TEST(actors_replicas, tied_embeddings_over_heterogeneous_replicas) {
  auto job = parse_job(replica_job, "replicas.toml");
  job.model.tie_embeddings = true;
  const plan p = three_heterogeneous_replicas();
  validate_plan(p, job, "plan");
  auto r = run(job, p);
  expect_close_to_reference(job, r);
  expect_replicas_identical(r, p);
  const runtime::parameter_values* table = nullptr;
  for (const auto& [chip, params] : r.by_chip)
    for (const auto& v : params)
      if (v.name == "embedding.wte" || v.name == "head.lm_head.weight") {
        if (table == nullptr)
          table = &v;
        EXPECT_EQ(v.values, table->values)
          << v.name << " on " << chip.to_string();
      }
  ASSERT_NE(table, nullptr);
}

TEST(actors_replicas, interleaved_replicas_equal_one_chip) {
  // Two replicas of two chips, two chunks each, cut differently: a chip's
  // layers are not contiguous (0:0 holds layers 0-1 and 3-4), so every
  // layer is a reduction group of its own, and two chips meet in several.
  auto job = parse_job(replica_job, "replicas.toml");
  plan p;
  p.schedule = schedule_kind::interleaved_1f1b;
  p.replicas = {
    {{stage(0, 0, 2), stage(1, 2, 3), stage(0, 3, 5), stage(1, 5, 6)}, 2, 2},
    {{stage(2, 0, 1), stage(3, 1, 3), stage(2, 3, 4), stage(3, 4, 6)}, 2, 2}};
  scheduler::check_plan(p, job, "plan");
  EXPECT_EQ(reduction_groups(p).size(), 6u);
  auto r = run(job, p);
  expect_close_to_reference(job, r);
  expect_replicas_identical(r, p);
}

// A live rebalance may shift sequences between replicas (docs/rebalance.md):
// micro-batch counts change at a step boundary, the loss stays scaled by
// the global batch's tokens, so gradients stay token-weighted. Only the
// order of the fp32 sums changes: the run stays within the bound above.
TEST(actors_replicas, micro_batches_shifted_between_replicas_stay_in_bound) {
  auto job = parse_job(replica_job, "replicas.toml");
  job.train.steps = 4;
  plan p;
  p.replicas = {{{stage(0, 0, 6)}, 2, 2}, {{stage(1, 0, 6)}, 2, 2}};
  validate_plan(p, job, "test");
  plan shifted = p;
  shifted.replicas[0].micro_batches = 3; // 6 of the 8 sequences
  shifted.replicas[1].micro_batches = 1;
  plan back = p;
  back.replicas[0].micro_batch_size = 1; // 4 micro-batches of 1
  back.replicas[0].micro_batches = 4;
  auto shared = std::make_shared<job_config>(job);
  actors::local_job local(shared, p);
  runtime::step_recorder obs;
  actors::run_options o(job.train.steps, true);
  o.replans = {{1, shifted}, {3, back}};
  local.run(o, obs);
  ASSERT_EQ(obs.rebalances.size(), 2u);
  EXPECT_EQ(obs.rebalances[0].moved_bytes, 0) << "no layer moved";
  expect_close_to_reference(job, {obs.losses(), local.parameters(), {}});
}

TEST(actors_replicas, plan_links_and_groups) {
  plan p;
  p.replicas = {{{stage(0, 0, 4), stage(1, 4, 6)}, 1, 1},
                {{stage(2, 0, 2), stage(3, 2, 6)}, 1, 1}};
  auto groups = reduction_groups(p);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0],
            (reduction_group{0, 2, {chip_id{0, 0}, chip_id{0, 2}}}));
  EXPECT_EQ(groups[1],
            (reduction_group{2, 4, {chip_id{0, 0}, chip_id{0, 3}}}));
  EXPECT_EQ(groups[2],
            (reduction_group{4, 6, {chip_id{0, 1}, chip_id{0, 3}}}));
  auto links = plan_links(p);
  std::vector<chip_link> expected = {{{0, 0}, {0, 1}}, {{0, 0}, {0, 2}},
                                     {{0, 0}, {0, 3}}, {{0, 1}, {0, 3}},
                                     {{0, 2}, {0, 3}}};
  EXPECT_EQ(links, expected);
}

} // namespace
} // namespace h2::test
