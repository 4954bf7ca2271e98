// HeteroAuto as a whole: never worse than the even plan, topology- and
// memory-aware layouts, the examples (the 1,024-chip one's planning time
// is printed, not asserted), the report and the plan's JSON.
#include "planner_fixtures.hpp"

#include "h2/scheduler/compare.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>

namespace h2::test {
namespace {

using scheduler::planner;
using scheduler::planner_options;

/// The even plan of every chip of `job` in id order (plan.mode = "even").
plan even_of(const job_config& job) {
  std::vector<chip_id> chips;
  for (const auto* c : job.chips())
    chips.push_back(c->id);
  return scheduler::even_plan(job, chips);
}

TEST(scheduler_planner, never_slower_than_the_even_plan) {
  int compared = 0;
  double best_ratio = 1;
  for (std::uint64_t seed = 200; seed < 280; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const int chips = 2 + static_cast<int>(seed % 7);
    auto in = random_instance(seed, chips, 1 + static_cast<int>(seed % 4),
                              chips + 2 + static_cast<int>(seed % 9),
                              4 * (1 + static_cast<int>(seed % 4)),
                              seed % 3 ? schedule_kind::one_f_one_b
                                       : schedule_kind::gpipe,
                              4 + static_cast<double>(seed % 5));
    in.job->train.micro_batch = seed % 2 ? 1 : 2;
    auto even = even_of(*in.job);
    scheduler::planner_options o;
    o.suggest_changes = false;
    planner pl(*in.job, *in.measurements, o);
    auto e = pl.simulate(even);
    if (!e.fits)
      continue;
    auto best = pl.run();
    EXPECT_LE(best.report.step_seconds, e.step_seconds * (1 + 1e-12));
    best_ratio =
      std::min(best_ratio, best.report.step_seconds / e.step_seconds);
    ++compared;
  }
  EXPECT_GT(compared, 40);
  EXPECT_LT(best_ratio, 0.8) << "heterogeneity should pay somewhere";
  std::printf("[ info ] %d instances; best auto / even = %.3f\n", compared,
              best_ratio);
}

// Four chips of one kind on two nodes joined by a slow link: the pipeline
// crosses it once (node-mates are neighbours).
TEST(scheduler_planner, neighbouring_stages_share_fast_links) {
  std::vector<kind_spec> kinds{{"a", "V", 400, 64, 400, 1e-6}};
  auto toml = job_toml(kinds, {{"a", "a"}, {"a", "a"}}, 10, 8,
                       schedule_kind::one_f_one_b, 1.0,
                       "[topology]\n[topology.between_hosts]\n"
                       "bandwidth_gb_per_s = 0.01\nlatency_seconds = 1e-3\n");
  auto job = parse_job(toml, "topology");
  synthetic_measurements m(job, 5);
  planner_options o;
  o.max_replicas = 1;
  auto r = scheduler::plan_auto(job, m, o);
  const auto& st = r.value.replicas.front().stages;
  int crossings = 0;
  for (std::size_t s = 1; s < st.size(); ++s)
    crossings += st[s].chip.node != st[s - 1].chip.node ? 1 : 0;
  EXPECT_LE(crossings, 1);
}

// Two kinds alike but for memory, 1F1B, six chips (stage 1 keeps a kind's
// chips together): once memory binds, the memory-rich chips go first,
// where activations pile up (stage s holds up to p - s micro-batches), and
// the planner finds that order.
TEST(scheduler_planner, memory_rich_chips_where_activations_pile_up) {
  std::vector<kind_spec> kinds{{"big", "V", 400, 96, 300, 5e-6},
                               {"small", "V", 400, 24, 300, 5e-6}};
  // Every chip equally fast: only memory tells them apart.
  scheduler::function_measurements m(
    [](const chip_spec&, layer_kind k, int mb) {
      double t = (k == layer_kind::block ? 1e-3 : 2e-4) * mb;
      return scheduler::layer_timing{t, 2 * t};
    },
    [](const chip_spec&, layer_kind) { return 1e-4; });
  for (double scale = 2.5e-4; scale > 1e-6; scale *= 0.9) {
    auto job = parse_job(
      job_toml(kinds, {{"small", "small", "small", "big", "big", "big"}}, 10,
               16, schedule_kind::one_f_one_b, scale),
      "memory");
    scheduler::planner_options o;
    o.max_replicas = 1;
    o.suggest_changes = false;
    o.micro_batch_sizes = {1};
    planner pl(job, m, o);
    std::optional<scheduler::stage_two_result> big_first, small_first;
    for (const auto& c : pl.stage_one()) {
      if (c.description == "1 x [big x3, small x3]")
        big_first = pl.stage_two(c);
      if (c.description == "1 x [small x3, big x3]")
        small_first = pl.stage_two(c);
    }
    ASSERT_TRUE(big_first && small_first);
    if (!big_first->feasible)
      break;
    if (small_first->feasible &&
        small_first->step_seconds <= big_first->step_seconds * (1 + 1e-9))
      continue; // memory does not bind yet
    auto r = pl.run();
    SCOPED_TRACE(r.report.explain());
    const auto& st = r.value.replicas.front().stages;
    EXPECT_EQ(job.find_chip(st.front().chip)->profile.name, "big");
    EXPECT_LE(r.report.step_seconds, big_first->step_seconds);
    return;
  }
  FAIL() << "memory never made the order matter";
}

TEST(scheduler_planner, small_examples_plan_and_fit) {
  for (const char* name : {"hetero-4.toml", "hetero-islands.toml",
                           "superlinear.toml", "demo.toml"}) {
    SCOPED_TRACE(name);
    auto job = load_job_file(std::string(H2_SOURCE_DIR) + "/examples/" + name);
    synthetic_measurements m(job, 7);
    planner pl(job, m);
    auto r = pl.run();
    EXPECT_TRUE(r.report.fits);
    validate_plan(plan_from_json(to_json(r.value), "json"), job, "plan");
    EXPECT_EQ(plan_from_json(to_json(r.value), "json"), r.value);
    auto explained = r.report.explain();
    for (const char* word : {"binding stage", "memory", "bubble", "search"})
      EXPECT_NE(explained.find(word), std::string::npos) << explained;
  }
}

TEST(scheduler_planner, cluster_1024_plans_and_fits) {
  auto full =
    load_job_file(std::string(H2_SOURCE_DIR) + "/examples/cluster-1024.toml");
  ASSERT_EQ(full.chips().size(), 1024u);
  EXPECT_GT(model_parameters(full.model), 95'000'000'000);
  EXPECT_LT(model_parameters(full.model), 105'000'000'000);
  for (int chips : {64, 256, 1024}) {
    // Every fourth or sixteenth node: the same four kinds in proportion.
    job_config job =
      chips == 1024 ? full : scheduler::sub_cluster(full, 1024 / chips);
    ASSERT_EQ(static_cast<int>(job.chips().size()), chips);
    synthetic_measurements m(job, 8);
    auto t0 = std::chrono::steady_clock::now();
    planner pl(job, m);
    auto r = pl.run();
    double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
    EXPECT_TRUE(r.report.fits);
    EXPECT_TRUE(pl.simulate(r.value).fits);
    validate_plan(r.value, job, "plan");
    // Planning time is printed, not asserted (bench/plan_scale checks it).
    std::printf("[ info ] %4d chips: planned in %.2f s (%zu layouts, %zu "
                "simulations): %zu replicas of %zu stages, step %.3f s\n",
                chips, seconds, r.report.candidates, r.report.simulations,
                r.value.replicas.size(), r.value.replicas.front().stages.size(),
                r.report.step_seconds);
  }
}

TEST(scheduler_planner, options_shape_the_plan) {
  auto in = random_instance(300, 4, 2, 10, 8, schedule_kind::one_f_one_b, 12);
  planner_options o;
  o.max_replicas = 1;
  o.micro_batch_sizes = {2};
  o.schedule = schedule_kind::gpipe;
  auto r = scheduler::plan_auto(*in.job, *in.measurements, o);
  EXPECT_EQ(r.value.replicas.size(), 1u);
  EXPECT_EQ(r.value.replicas.front().micro_batch_size, 2);
  EXPECT_EQ(r.value.replicas.front().micro_batches, 4);
  EXPECT_EQ(r.value.schedule, schedule_kind::gpipe);
  // Only the chips asked for.
  o = {};
  o.chips = {in.job->chips()[0]->id, in.job->chips()[1]->id};
  r = scheduler::plan_auto(*in.job, *in.measurements, o);
  for (const auto& rep : r.value.replicas)
    for (const auto& s : rep.stages)
      EXPECT_TRUE(s.chip == o.chips[0] || s.chip == o.chips[1]);
  o.chips = {chip_id{9, 9}};
  EXPECT_THROW(planner(*in.job, *in.measurements, o), config_error);
}

// The report's figures are the simulator's: binding stage, headroom,
// throughput.
TEST(scheduler_planner, report_matches_the_simulation) {
  auto in = random_instance(301, 5, 3, 12, 8, schedule_kind::one_f_one_b, 2);
  planner pl(*in.job, *in.measurements);
  auto r = pl.run();
  auto again = pl.evaluate(r.value, true);
  EXPECT_DOUBLE_EQ(again.step_seconds, r.report.step_seconds);
  EXPECT_FALSE(again.sim.timeline.empty());
  EXPECT_DOUBLE_EQ(r.report.tokens_per_second, in.job->train.global_batch *
                                                 in.job->model.seq_len /
                                                 r.report.step_seconds);
  double busiest = 0, tightest = 1;
  for (const auto& rep : r.report.replicas)
    for (const auto& s : rep.stages) {
      busiest = std::max(busiest, s.compute_seconds);
      tightest = std::min(tightest,
                          (s.capacity_bytes - s.peak_bytes) / s.capacity_bytes);
    }
  const auto& b =
    r.report.replicas[static_cast<std::size_t>(r.report.binding_replica)]
      .stages[static_cast<std::size_t>(r.report.binding_stage)];
  EXPECT_DOUBLE_EQ(b.compute_seconds, busiest);
  EXPECT_DOUBLE_EQ(r.report.memory_headroom, tightest);
  EXPECT_GT(r.report.candidates, 0u);
  EXPECT_GT(r.report.measurements, 0u);
  EXPECT_EQ(
    r.report.summary().rfind(
      "predicted step " + scheduler::seconds_text(r.report.step_seconds) + ", ",
      0),
    0u)
    << r.report.summary();
  EXPECT_EQ(scheduler::seconds_text(1.5), "1.500 s");
  EXPECT_EQ(scheduler::seconds_text(0.0123), "12.300 ms");
  EXPECT_EQ(scheduler::seconds_text(4e-6), "4.000 us");
  EXPECT_EQ(scheduler::bytes_text(3.5 * (1 << 30)), "3.5 GiB");
  EXPECT_EQ(scheduler::bytes_text(5 << 20), "5.0 MiB");
  EXPECT_EQ(scheduler::bytes_text(1536), "1.5 KiB");
}

TEST(scheduler_planner, deal_chunks_keeps_each_chips_layers) {
  plan p;
  p.schedule = schedule_kind::one_f_one_b;
  replica_plan r;
  r.micro_batches = 4;
  r.stages = {{chip_id{0, 0}, 0, 5, true}, {chip_id{0, 1}, 5, 8, false}};
  p.replicas.push_back(r);
  auto dealt = scheduler::deal_chunks(p, 2);
  ASSERT_TRUE(dealt.has_value());
  EXPECT_EQ(dealt->replicas[0].stages,
            (std::vector<stage_plan>{{chip_id{0, 0}, 0, 3, true},
                                     {chip_id{0, 1}, 3, 5, false},
                                     {chip_id{0, 0}, 5, 7, true},
                                     {chip_id{0, 1}, 7, 8, false}}));
  EXPECT_EQ(scheduler::chunks_per_chip(*dealt), 2);
  EXPECT_EQ(scheduler::layout_of(dealt->replicas[0]),
            scheduler::pipeline_layout::dealt({2, 2}));
  // 0:1 holds 3 layers: it takes one from 0:0 to hold 4 chunks.
  auto four = scheduler::deal_chunks(p, 4);
  ASSERT_TRUE(four.has_value());
  EXPECT_EQ(four->replicas[0].stages.size(), 8u);
  EXPECT_EQ(four->replicas[0].stages[1], (stage_plan{chip_id{0, 1}, 1, 2, {}}));
  EXPECT_FALSE(scheduler::deal_chunks(p, 5).has_value()); // 8 layers < 10
}

// ZeRO-1 is weighed, not assumed, where it can lose: with bf16 reductions
// its fp32 parameter all-gather moves more bytes than the all-reduce's
// second half, so plan_auto plans with and without it and keeps the faster
// (sharded on a tie: it needs less memory). With fp32 reductions it is kept.
TEST(scheduler_planner, zero1_is_kept_only_where_it_is_faster) {
  std::map<bool, int> kept;
  for (const char* name :
       {"hetero-islands.toml", "superlinear.toml", "demo.toml"}) {
    SCOPED_TRACE(name);
    auto job = load_job_file(std::string(H2_SOURCE_DIR) + "/examples/" + name);
    job.plan.zero1 = true;
    job.plan.search_schedule = false;
    job.transport.reduce_dtype = dtype::bf16;
    synthetic_measurements m(job, 7);
    planner_options o;
    o.suggest_changes = false;
    const auto sharded = planner(job, m, o).run();
    if (!sharded.value.zero1)
      continue; // one replica: nothing to shard
    auto unsharded_job = job;
    unsharded_job.plan.zero1 = false;
    const auto unsharded = planner(unsharded_job, m, o).run();
    const auto chosen = scheduler::plan_auto(job, m, o);
    const bool on =
      sharded.report.step_seconds <= unsharded.report.step_seconds;
    EXPECT_EQ(chosen.value.zero1, on);
    EXPECT_DOUBLE_EQ(
      chosen.report.step_seconds,
      std::min(sharded.report.step_seconds, unsharded.report.step_seconds));
    EXPECT_EQ(chosen.report.zero1_reason.rfind(on ? "on: " : "off: ", 0), 0u)
      << chosen.report.zero1_reason;
    EXPECT_NE(chosen.report.explain().find("ZeRO-1: "), std::string::npos);
    ++kept[on];
    job.transport.reduce_dtype = dtype::fp32;
    const auto fp32 = scheduler::plan_auto(job, m, o);
    EXPECT_TRUE(fp32.value.zero1);
    EXPECT_TRUE(fp32.report.zero1_reason.empty());
  }
  EXPECT_GE(kept[true] + kept[false], 2) << "examples with replicas";
  std::printf("[ info ] ZeRO-1 kept on %d, dropped on %d examples\n",
              kept[true], kept[false]);
}

TEST(scheduler_planner, interleaved_deals_the_1f1b_plans_layers_into_chunks) {
  int checked = 0;
  for (const char* name : {"hetero-4.toml", "hetero-islands.toml",
                           "superlinear.toml", "demo.toml"}) {
    SCOPED_TRACE(name);
    auto job = load_job_file(std::string(H2_SOURCE_DIR) + "/examples/" + name);
    synthetic_measurements m(job, 7);
    scheduler::planner_options o;
    o.suggest_changes = false;
    o.schedule = schedule_kind::one_f_one_b;
    const auto base = scheduler::plan_auto(job, m, o);
    bool pipelined = true; // one chip has nothing to interleave with
    for (const auto& r : base.value.replicas)
      pipelined = pipelined && r.stages.size() >= 2;
    if (!pipelined)
      continue;
    o.schedule = schedule_kind::interleaved_1f1b;
    std::optional<scheduler::planned> found;
    try {
      found = scheduler::plan_auto(job, m, o);
    } catch (const scheduler::infeasible_error& e) {
      // More chunks than layers, or their activations do not fit.
      EXPECT_NE(std::string(e.what()).find("interleaved-1f1b"),
                std::string::npos)
        << e.what();
      continue;
    }
    ++checked;
    const auto& il = *found;
    EXPECT_EQ(il.value.schedule, schedule_kind::interleaved_1f1b);
    const int v = scheduler::chunks_per_chip(il.value);
    EXPECT_GE(v, 2);
    EXPECT_LE(v, 4);
    EXPECT_FALSE(il.report.proven_optimal) << "chunk bounds are not searched";
    // The stage-1 search the chunks came from stays in the report.
    EXPECT_FALSE(il.report.shape.empty());
    EXPECT_GT(il.report.candidates, 0u);
    scheduler::check_plan(il.value, job, "plan");
    // Each chip holds as many layers as HeteroAuto's 1F1B plan of the same
    // micro-batching gave it (the plan may re-plan 1F1B with smaller
    // micro-batches, so compare chip sets and layer totals).
    std::map<chip_id, int> layers;
    for (const auto& r : il.value.replicas)
      for (const auto& s : r.stages)
        layers[s.chip] += s.num_layers();
    int total = 0;
    for (const auto& [chip, n] : layers)
      total += n;
    EXPECT_EQ(total, job.model.num_layers() *
                       static_cast<int>(il.value.replicas.size()));
    // The report is the simulator's prediction of the plan it returns.
    EXPECT_EQ(scheduler::evaluate_plan(job, il.value, m).step_seconds,
              il.report.step_seconds);
  }
  EXPECT_GE(checked, 1);
}

TEST(scheduler_planner, make_plan_refuses_auto_jobs) {
  auto in = random_instance(302, 2, 1, 6, 4, schedule_kind::one_f_one_b, 4);
  EXPECT_THROW(scheduler::make_plan(*in.job), config_error);
}

TEST(scheduler_planner, even_plan_spreads_layers_over_the_given_chips) {
  auto in = random_instance(303, 3, 2, 8, 4, schedule_kind::gpipe, 4);
  in.job->train.micro_batch = 2;
  std::vector<chip_id> chips{in.job->chips()[2]->id, in.job->chips()[0]->id};
  plan p = scheduler::even_plan(*in.job, chips);
  ASSERT_EQ(p.replicas.size(), 1u);
  const auto& r = p.replicas.front();
  EXPECT_EQ(r.micro_batch_size, 2);
  EXPECT_EQ(r.micro_batches, 2);
  ASSERT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.stages[0].chip, chips[0]);
  EXPECT_EQ(r.stages[0].num_layers(), 4);
  EXPECT_EQ(r.stages[1].chip, chips[1]);
  EXPECT_EQ(r.stages[1].end_layer, 8);
  EXPECT_EQ(p.schedule, schedule_kind::gpipe);
  EXPECT_THROW(scheduler::even_plan(*in.job, {}), config_error);
  std::vector<chip_id> too_many(9, chips[0]);
  EXPECT_THROW(scheduler::even_plan(*in.job, too_many), config_error);
}

TEST(scheduler_planner, sub_cluster_keeps_every_nth_node) {
  auto full =
    load_job_file(std::string(H2_SOURCE_DIR) + "/examples/cluster-1024.toml");
  auto job = scheduler::sub_cluster(full, 16);
  ASSERT_EQ(job.nodes.size(), 8u);
  EXPECT_EQ(job.chips().size(), 64u);
  EXPECT_EQ(job.plan.stages.size(), 64u);
  EXPECT_EQ(job.train.global_batch, full.train.global_batch / 16);
  std::map<std::string, int> kinds;
  for (std::size_t n = 0; n < job.nodes.size(); ++n) {
    EXPECT_EQ(job.nodes[n].rank, static_cast<int>(n));
    for (const auto& c : job.nodes[n].chips) {
      EXPECT_EQ(c.id.node, static_cast<int>(n));
      EXPECT_EQ(c.profile.name, full.nodes[16 * n]
                                  .chips[static_cast<std::size_t>(c.id.index)]
                                  .profile.name);
      ++kinds[c.profile.name];
    }
  }
  EXPECT_EQ(kinds.size(), 4u);
  for (const auto& [name, count] : kinds)
    EXPECT_EQ(count, 16) << name;
}

// --compare's figures: the even plan of the planned chips, every kind alone
// with its share of the batch on its own chips, and the ratio of the
// throughputs.
TEST(scheduler_planner, compare_with_baselines) {
  auto in = random_instance(304, 6, 2, 10, 12, schedule_kind::one_f_one_b, 20);
  in.job->train.micro_batch = 2;
  planner pl(*in.job, *in.measurements);
  auto best = pl.run();
  auto c = scheduler::compare_with_baselines(*in.job, *in.measurements, {},
                                             best.report);
  ASSERT_TRUE(c.even.feasible) << c.even.why_not;
  EXPECT_EQ(c.even.value, even_of(*in.job));
  EXPECT_DOUBLE_EQ(c.even.step_seconds, pl.simulate(c.even.value).step_seconds);
  EXPECT_LE(best.report.step_seconds, c.even.step_seconds);
  ASSERT_EQ(c.homogeneous.size(), 2u);
  double sum = 0;
  int chips = 0;
  for (const auto& h : c.homogeneous) {
    SCOPED_TRACE(h.name);
    ASSERT_TRUE(h.feasible) << h.why_not;
    chips += h.chips;
    EXPECT_EQ(h.global_batch,
              static_cast<int>(std::lround(12.0 * h.chips / 6.0)));
    EXPECT_EQ(h.value.global_batch(), h.global_batch);
    for (const auto& r : h.value.replicas)
      for (const auto& s : r.stages)
        EXPECT_EQ(scheduler::chip_kind_key(*in.job->find_chip(s.chip)), h.name);
    EXPECT_DOUBLE_EQ(h.tokens_per_second, static_cast<double>(h.global_batch) *
                                            in.job->model.seq_len /
                                            h.step_seconds);
    sum += h.tokens_per_second;
  }
  EXPECT_EQ(chips, 6);
  EXPECT_DOUBLE_EQ(c.homogeneous_tokens_per_second, sum);
  EXPECT_DOUBLE_EQ(c.super_linear_ratio, best.report.tokens_per_second / sum);
  // Every kind trains alone: one ratio, and each kind's plan says what
  // binds it.
  EXPECT_FALSE(c.trainable.has_value());
  EXPECT_DOUBLE_EQ(c.trainable_ratio, c.super_linear_ratio);
  for (const auto& h : c.homogeneous) {
    EXPECT_FALSE(h.shape.empty());
    for (const char* what : {"bubble", "memory", "links", "micro-batch"})
      EXPECT_NE(h.binding.find(what), std::string::npos) << h.binding;
  }
}

// A kind that cannot train alone counts 0 in the paper's sum; the ratio
// over the kinds that can compares their mixed plan with their sum, and
// the kind that cannot is told which change would let it.
TEST(scheduler_planner, compare_without_the_kinds_that_cannot_train_alone) {
  int found = 0;
  for (std::uint64_t seed = 400; seed < 460 && found < 2; ++seed) {
    auto in =
      random_instance(seed, 6, 2, 8, 12, schedule_kind::one_f_one_b, 2.5);
    scheduler::planner_options o;
    o.suggest_changes = false;
    planner pl(*in.job, *in.measurements, o);
    scheduler::planned best;
    try {
      best = pl.run();
    } catch (const scheduler::infeasible_error&) {
      continue;
    }
    auto c = scheduler::compare_with_baselines(*in.job, *in.measurements, {},
                                               best.report);
    int alone = 0;
    for (const auto& h : c.homogeneous)
      alone += h.feasible ? 1 : 0;
    if (alone == 0 || alone == static_cast<int>(c.homogeneous.size()))
      continue;
    SCOPED_TRACE(in.job->name);
    ++found;
    ASSERT_TRUE(c.trainable.has_value());
    int chips = 0, batch = 0;
    for (const auto& h : c.homogeneous) {
      if (!h.feasible) {
        EXPECT_NE(h.why_not.find("does not fit"), std::string::npos);
        EXPECT_FALSE(h.lever.empty());
        continue;
      }
      chips += h.chips;
      batch += h.global_batch;
    }
    EXPECT_EQ(c.trainable->chips, chips);
    EXPECT_EQ(c.trainable->global_batch, batch);
    if (c.trainable->feasible) {
      EXPECT_DOUBLE_EQ(c.trainable_ratio, c.trainable->tokens_per_second /
                                            c.homogeneous_tokens_per_second);
    }
    EXPECT_DOUBLE_EQ(c.super_linear_ratio, best.report.tokens_per_second /
                                             c.homogeneous_tokens_per_second);
  }
  EXPECT_EQ(found, 2) << "instances with a kind that cannot train alone";
}

} // namespace
} // namespace h2::test
