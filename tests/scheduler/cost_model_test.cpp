// The cost model: memory against what the runtime's accounting measured,
// stage costs, links from the topology, all-reduce buckets, memoised
// measurements.
#include "h2/scheduler/cost_model.hpp"

#include "planner_fixtures.hpp"

#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace h2::scheduler {
namespace {

gpt_config small_gpt() {
  return test::gpt_shape(65, 64, 128, 4, 3, 512);
}

// Activations per micro-batch as the runtime's memory accounting measured
// them (h2-launch --json-log, one chip, GPipe, the peak's growth from 1 to
// 2 to 4 micro-batches; model: small_gpt): a block keeps 9232 bytes per
// token in fp32; in bf16 8208 per token at 128 tokens, of which 3072 are
// its bf16 weight copies (393216 bytes per micro-batch).
TEST(scheduler_cost_model, activations_match_the_runtime) {
  auto cfg = small_gpt();
  auto fp32 = layer_memory_of(cfg, layer_kind::block, 2, dtype::fp32);
  EXPECT_DOUBLE_EQ(fp32.activation_bytes, 9232.0 * 128);
  auto bf16 = layer_memory_of(cfg, layer_kind::block, 2, dtype::bf16);
  EXPECT_DOUBLE_EQ(bf16.activation_bytes, 8208.0 * 128);
  EXPECT_DOUBLE_EQ(
    layer_memory_of(cfg, layer_kind::block, 4, dtype::bf16).activation_bytes -
      bf16.activation_bytes,
    (8208.0 - 3072.0) * 128);
  // Embedding + head + the micro-batch's tokens and targets: 1308 bytes
  // per token in fp32, 151304 per 128 tokens in bf16 (within the 8 bytes
  // of a scalar).
  auto ends = [&](dtype d, int b) {
    return layer_memory_of(cfg, layer_kind::embedding, b, d).activation_bytes +
           layer_memory_of(cfg, layer_kind::head, b, d).activation_bytes +
           batch_bytes(cfg, b);
  };
  EXPECT_DOUBLE_EQ(ends(dtype::fp32, 2), 1308.0 * 128);
  EXPECT_NEAR(ends(dtype::bf16, 2), 151304.0, 8.0);
  // Weights, gradients and both AdamW moments in fp32.
  EXPECT_DOUBLE_EQ(fp32.static_bytes,
                   16.0 * static_cast<double>(layer_parameters(cfg, 1)) +
                     64.0 * 64.0);
  // The AdamW update's temporaries: 1 MiB for the 128 x 512 MLP matrix,
  // measured as the peak of a step with one micro-batch.
  EXPECT_DOUBLE_EQ(fp32.optimizer_working_bytes, 1 << 20);
}

// The llama family, measured the same way (small_gpt's shape, family =
// "llama", 4 key/value heads; 2 of them change the peak by under 1 byte
// per token): a block keeps 15368 bytes per token in fp32 and 14216 in
// bf16, of which 4096 are its bf16 weight copies (524288 bytes per
// micro-batch); embedding, head and batch 2328 in fp32, 2200.06 in bf16.
TEST(scheduler_cost_model, llama_activations_match_the_runtime) {
  auto cfg = small_gpt();
  cfg.family = model_family::llama;
  auto fp32 = layer_memory_of(cfg, layer_kind::block, 2, dtype::fp32);
  EXPECT_DOUBLE_EQ(fp32.activation_bytes, 15368.0 * 128);
  auto bf16 = layer_memory_of(cfg, layer_kind::block, 2, dtype::bf16);
  EXPECT_DOUBLE_EQ(bf16.activation_bytes, 14216.0 * 128);
  auto ends = [&](dtype d) {
    return layer_memory_of(cfg, layer_kind::embedding, 2, d).activation_bytes +
           layer_memory_of(cfg, layer_kind::head, 2, d).activation_bytes +
           batch_bytes(cfg, 2);
  };
  EXPECT_DOUBLE_EQ(ends(dtype::fp32), 2328.0 * 128);
  EXPECT_NEAR(ends(dtype::bf16), 281864.0, 8.0);
}

/// The memory coefficients of small_gpt (or its llama twin) at micro-batches
/// of 2 sequences in `d`.
stage_coefficients memory_of(model_family family, dtype d) {
  auto cfg = small_gpt();
  cfg.family = family;
  stage_coefficients c;
  c.memory_embedding = layer_memory_of(cfg, layer_kind::embedding, 2, d);
  c.memory_block = layer_memory_of(cfg, layer_kind::block, 2, d);
  c.memory_head = layer_memory_of(cfg, layer_kind::head, 2, d);
  c.boundary_bytes = boundary_bytes(cfg, 2);
  c.batch_bytes = batch_bytes(cfg, 2);
  return c;
}

// Selective recomputation against the runtime's accounting (h2-launch
// --json-log, one chip holding the whole model, GPipe, micro-batches of 2
// sequences; the peak's growth from 2 to 4 micro-batches in flight): what
// each policy keeps per micro-batch, in bytes less than keeping everything.
// A block recomputed whole keeps only its output; an attention core
// recomputed drops its softmax probabilities.
TEST(scheduler_cost_model, selective_recomputation_matches_the_runtime) {
  struct measured {
    model_family family;
    dtype d;
    double attention, one_block, three_blocks; ///< bytes saved per micro-batch
  };
  for (const auto& m :
       {measured{model_family::gpt2, dtype::fp32, 393216, 1116160, 3348480},
        measured{model_family::gpt2, dtype::bf16, 196608, 985088, 2955264},
        measured{model_family::llama, dtype::fp32, 393216, 1901568, 5704704},
        measured{model_family::llama, dtype::bf16, 196608, 1754112, 5262336}}) {
    SCOPED_TRACE(testing::Message()
                 << to_string(m.family) << " " << to_string(m.d));
    const auto c = memory_of(m.family, m.d);
    const auto all = stage_layers::of(small_gpt(), 0, 5);
    const double kept = c.cost(all, {}).held_bytes;
    EXPECT_DOUBLE_EQ(kept - c.cost(all, {false, 0, true}).held_bytes,
                     m.attention);
    EXPECT_DOUBLE_EQ(kept - c.cost(all, {false, 1, false}).held_bytes,
                     m.one_block);
    EXPECT_DOUBLE_EQ(kept - c.cost(all, {false, 3, false}).held_bytes,
                     m.three_blocks);
    // Blocks beyond the stage's are capped; with every block whole the
    // attention flag has nothing left to recompute.
    EXPECT_EQ(c.cost(all, {false, 7, true}).recompute,
              (recompute_policy{false, 3, false}));
  }
}

TEST(scheduler_cost_model, stage_costs_sum_layers_and_recomputation) {
  auto cfg = small_gpt();
  stage_coefficients c;
  c.embedding = {1, 2};
  c.block = {10, 20};
  c.head = {5, 7};
  c.optimizer_embedding = 0.1;
  c.optimizer_block = 1;
  c.optimizer_head = 0.5;
  c.memory_embedding =
    layer_memory_of(cfg, layer_kind::embedding, 1, dtype::bf16);
  c.memory_block = layer_memory_of(cfg, layer_kind::block, 1, dtype::bf16);
  c.memory_head = layer_memory_of(cfg, layer_kind::head, 1, dtype::bf16);
  c.boundary_bytes = boundary_bytes(cfg, 1);
  c.batch_bytes = batch_bytes(cfg, 1);
  // Layers [1, 5) of 5: three blocks and the head.
  auto l = stage_layers::of(cfg, 1, 5);
  EXPECT_FALSE(l.embedding);
  EXPECT_TRUE(l.head);
  EXPECT_EQ(l.blocks, 3);
  auto keep = c.cost(l, recompute_policy::none());
  EXPECT_DOUBLE_EQ(keep.forward_seconds, 35);
  EXPECT_DOUBLE_EQ(keep.backward_seconds, 67);
  EXPECT_DOUBLE_EQ(keep.optimizer_seconds, 3.5);
  auto rc = c.cost(l, recompute_policy::whole());
  EXPECT_DOUBLE_EQ(rc.backward_seconds, 67 + 35);
  EXPECT_DOUBLE_EQ(rc.static_bytes, keep.static_bytes);
  // Recomputing keeps only the stage's input and the batch per micro-batch
  // and rebuilds one micro-batch's activations for its backward.
  EXPECT_DOUBLE_EQ(rc.held_bytes, c.boundary_bytes + c.batch_bytes);
  EXPECT_DOUBLE_EQ(keep.held_bytes - rc.held_bytes,
                   rc.working_bytes - keep.working_bytes);
  EXPECT_LT(rc.peak_bytes(4), keep.peak_bytes(4));
  EXPECT_DOUBLE_EQ(keep.peak_bytes(2),
                   keep.static_bytes +
                     std::max(2 * keep.held_bytes + keep.working_bytes,
                              keep.optimizer_working_bytes));
  EXPECT_DOUBLE_EQ(keep.gradient_bytes,
                   4.0 * static_cast<double>(layer_parameters(cfg, 1) * 3 +
                                             layer_parameters(cfg, 4)));
}

// ZeRO-1 (docs/planner.md, "Sharded optimizer state"): of R replicas each
// chip keeps 1 / R of the moments (8 bytes per parameter, a tied table's
// excepted) and updates that share; the rest of the stage is unchanged.
TEST(scheduler_cost_model, zero1_keeps_a_share_of_the_moments) {
  auto cfg = small_gpt();
  stage_coefficients c;
  c.optimizer_block = 1;
  c.optimizer_head = 0.5;
  for (bool tied : {false, true}) {
    cfg.tie_embeddings = tied;
    c.memory_embedding =
      layer_memory_of(cfg, layer_kind::embedding, 1, dtype::fp32);
    c.memory_block = layer_memory_of(cfg, layer_kind::block, 1, dtype::fp32);
    c.memory_head = layer_memory_of(cfg, layer_kind::head, 1, dtype::fp32);
    const auto l = stage_layers::of(cfg, 1, 5); // three blocks and the head
    const auto whole = c.cost(l, recompute_policy::none());
    const double table = tied ? 8.0 * cfg.vocab_size * cfg.d_model : 0.0;
    EXPECT_DOUBLE_EQ(whole.shardable_bytes, 2 * whole.gradient_bytes - table);
    EXPECT_EQ(whole.sharded(1).static_bytes, whole.static_bytes);
    const auto four = whole.sharded(4);
    EXPECT_DOUBLE_EQ(whole.static_bytes - four.static_bytes,
                     0.75 * whole.shardable_bytes);
    EXPECT_DOUBLE_EQ(
      four.optimizer_seconds,
      3.5 * (2 * whole.gradient_bytes - 0.75 * whole.shardable_bytes) /
        (2 * whole.gradient_bytes));
    EXPECT_EQ(four.held_bytes, whole.held_bytes);
    EXPECT_EQ(four.working_bytes, whole.working_bytes);
  }
}

job_config two_node_job(const std::string& emulation,
                        const std::string& topology = "") {
  return parse_job(R"([model]
vocab_size = 65
seq_len = 64
d_model = 128
n_head = 4
n_layer = 3
[data]
source = "markov"
entropy_rate = 1.0
[train]
global_batch = 8
[emulation]
)" + emulation + R"(
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:a100-sxm-40gb"]
[[nodes]]
chips = ["emulated:mi250x", "emulated:h100-sxm"]
[[nodes]]
chips = ["emulated:h100-sxm"]
)" + topology,
                   "links");
}

// Without [topology], a link costs what an emulated receiver charges
// (devices/emulated/cost_function.cpp): the slower interconnect, the
// receiver's latency x overhead_scale, all x time_scale.
TEST(scheduler_cost_model, links_default_to_what_emulated_chips_charge) {
  auto job = two_node_job("time_scale = 3\noverhead_scale = 0.5");
  const auto& h100 = *job.find_chip({0, 0});
  const auto& a100 = *job.find_chip({0, 1});
  auto l = resolve_link(job, h100, a100);
  EXPECT_EQ(l.tier, link_tier::same_node);
  EXPECT_DOUBLE_EQ(l.bandwidth_bytes_per_second, 300e9);
  EXPECT_DOUBLE_EQ(l.latency_seconds, 5e-6 * 0.5);
  EXPECT_DOUBLE_EQ(l.seconds(3e9), 3 * (5e-6 * 0.5 + 3e9 / 300e9));
  auto over = two_node_job("link_bandwidth_bytes_per_second = 1e9\n"
                           "link_latency_seconds = 1e-3");
  auto o = resolve_link(over, *over.find_chip({1, 0}), *over.find_chip({0, 1}));
  EXPECT_DOUBLE_EQ(o.seconds(1e9), 1e-3 + 1);
}

TEST(scheduler_cost_model, links_follow_the_topology_tiers) {
  auto job = two_node_job("", R"(
[topology]
nodes_per_host = 2
[topology.same_host]
bandwidth_gb_per_s = 100
[topology.between_hosts]
bandwidth_gb_per_s = 25
latency_seconds = 1e-5
[topology.between_islands]
bandwidth_gb_per_s = 10
latency_seconds = 2e-5
)");
  EXPECT_EQ(job.topology.nodes_per_host, 2);
  const auto& a = *job.find_chip({0, 0}); // NVIDIA, node 0, host 0
  const auto& b = *job.find_chip({1, 1}); // NVIDIA, node 1, host 0
  const auto& c = *job.find_chip({2, 0}); // NVIDIA, node 2, host 1
  const auto& amd = *job.find_chip({1, 0});
  EXPECT_EQ(tier_between(job, a, *job.find_chip({0, 1})), link_tier::same_node);
  EXPECT_EQ(tier_between(job, a, b), link_tier::same_host);
  EXPECT_EQ(tier_between(job, a, c), link_tier::between_hosts);
  EXPECT_EQ(tier_between(job, c, amd), link_tier::between_islands);
  // A tier without a latency keeps the receiver's own.
  auto host = resolve_link(job, a, b);
  EXPECT_DOUBLE_EQ(host.bandwidth_bytes_per_second, 100e9);
  EXPECT_DOUBLE_EQ(host.latency_seconds, 5e-6);
  EXPECT_DOUBLE_EQ(resolve_link(job, a, c).seconds(25e9), 1e-5 + 1);
  EXPECT_DOUBLE_EQ(resolve_link(job, amd, c).seconds(10e9), 2e-5 + 1);
}

TEST(scheduler_cost_model, allreduce_buckets_and_ring) {
  auto job = two_node_job("", R"(
[topology]
[topology.between_hosts]
bandwidth_gb_per_s = 1
latency_seconds = 0.001
)");
  // 25 MiB buckets hold the whole small model: one bucket per group.
  test::synthetic_measurements m(job, 1);
  cost_model cm(job, m);
  auto all = stage_layers::of(job.model, 0, job.model.num_layers());
  auto one = cm.buckets(all);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_DOUBLE_EQ(one[0],
                   4.0 * static_cast<double>(model_parameters(job.model)));
  // 64 KiB buckets: whole tensors, a bucket closed before it overflows.
  job.transport.bucket_bytes = 64 << 10;
  auto many = cm.buckets(stage_layers::of(job.model, 1, 2));
  double sum = 0;
  for (double b : many) {
    sum += b;
    // Over the limit only as one tensor alone (qkv, fc1, fc2 weights).
    EXPECT_TRUE(b <= 64 << 10 || b == 4.0 * 3 * 128 * 128 ||
                b == 4.0 * 128 * 512)
      << b;
  }
  EXPECT_DOUBLE_EQ(sum,
                   4.0 * static_cast<double>(layer_parameters(job.model, 1)));
  EXPECT_GT(many.size(), 3u);
  // A ring of two H100s on different hosts: per bucket 2 steps of a half
  // share over the 1 GB/s link.
  std::vector<const chip_spec*> ring{job.find_chip({0, 0}),
                                     job.find_chip({2, 0})};
  double expect = 0;
  for (double b : many)
    expect += 2 * (0.001 + b / 2 / 1e9);
  EXPECT_DOUBLE_EQ(cm.allreduce_seconds(ring, 1, 2), expect);
  // bf16 on the wire halves the bytes.
  job.transport.reduce_dtype = dtype::bf16;
  double half = 0;
  for (double b : many)
    half += 2 * (0.001 + b / 4 / 1e9);
  EXPECT_DOUBLE_EQ(cm.allreduce_seconds(ring, 1, 2), half);
  EXPECT_DOUBLE_EQ(cm.allreduce_seconds({ring[0]}, 1, 2), 0);
}

TEST(scheduler_cost_model, measurements_are_taken_once_per_kind) {
  auto job = two_node_job("");
  test::synthetic_measurements m(job, 2);
  cost_model cm(job, m);
  // Three H100s share one kind: asking for all of them measures once.
  for (auto id : {chip_id{0, 0}, chip_id{1, 1}, chip_id{2, 0}})
    cm.coefficients(*job.find_chip(id), 2);
  EXPECT_EQ(m.calls, 6); // three layer kinds + three optimizer updates
  cm.coefficients(*job.find_chip({0, 1}), 2);
  EXPECT_EQ(m.calls, 12);
  cm.coefficients(*job.find_chip({0, 0}), 4); // another micro-batch size
  EXPECT_EQ(m.calls, 15);
  EXPECT_EQ(cm.measurements_taken(), 15u);
  EXPECT_EQ(chip_kind_key(*job.find_chip({0, 0})), "h100-sxm/bf16");
  // Measurements that are not times are refused.
  function_measurements bad(
    [](const chip_spec&, layer_kind, int) {
      return layer_timing{-1, 1};
    },
    [](const chip_spec&, layer_kind) { return 1.0; });
  cost_model cb(job, bad);
  EXPECT_THROW(cb.coefficients(*job.find_chip({0, 0}), 1), h2::error);
}

TEST(scheduler_cost_model, capacity_is_scaled_memory) {
  auto job = two_node_job("memory_scale = 0.25");
  test::synthetic_measurements m(job, 3);
  cost_model cm(job, m);
  EXPECT_DOUBLE_EQ(cm.capacity_bytes(*job.find_chip({0, 1})),
                   std::floor(40.0 * (1 << 30) * 0.25));
}

TEST(scheduler_cost_model, a_gpus_capacity_comes_from_the_measurements) {
  // A real chip's profile has no memory: what its opened device offers
  // (free memory minus the reserve) is asked once per device.
  auto job = parse_job(test::model_toml(17, 8, 16, 2, 2) + R"(
[train]
global_batch = 4
[[nodes]]
chips = ["cuda:0", "cuda:1", "emulated:h100-sxm"]
)",
                       "gpu.toml");
  struct gpus final : chip_measurements {
    layer_timing layer(const chip_spec&, layer_kind, int) override {
      return {1, 2};
    }
    double optimizer(const chip_spec&, layer_kind) override { return 1; }
    std::optional<double> capacity_bytes(const chip_spec& chip) override {
      ++asked;
      if (chip.backend != device_backend::cuda)
        return std::nullopt;
      return chip.device_index == 0 ? 8e9 : 4e9;
    }
    int asked = 0;
  } m;
  cost_model cm(job, m);
  EXPECT_DOUBLE_EQ(cm.capacity_bytes(*job.find_chip({0, 0})), 8e9);
  EXPECT_DOUBLE_EQ(cm.capacity_bytes(*job.find_chip({0, 1})), 4e9);
  EXPECT_DOUBLE_EQ(cm.capacity_bytes(*job.find_chip({0, 0})), 8e9);
  EXPECT_EQ(m.asked, 2);
  // Emulated chips keep their profile's memory; no question asked.
  EXPECT_DOUBLE_EQ(cm.capacity_bytes(*job.find_chip({0, 2})), 80.0 * (1 << 30));
  EXPECT_EQ(m.asked, 2);
  // Sources that open no chips leave a GPU unbounded, as before.
  function_measurements plain(
    [](const chip_spec&, layer_kind, int) {
      return layer_timing{1, 2};
    },
    [](const chip_spec&, layer_kind) { return 1.0; });
  cost_model unbounded(job, plain);
  EXPECT_TRUE(std::isinf(unbounded.capacity_bytes(*job.find_chip({0, 0}))));
}

} // namespace
} // namespace h2::scheduler
