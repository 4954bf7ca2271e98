#include "h2/core/model_config.hpp"

#include "h2/core/error.hpp"

#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <cstdint>

namespace h2 {
namespace {

/// A small GPT whose counts are easy to check by hand.
gpt_config small() {
  return test::gpt_shape(11, 7, 8, 2, 3, 32);
}

TEST(core_model_config, layer_kinds) {
  auto c = small();
  ASSERT_EQ(c.num_layers(), 5);
  EXPECT_EQ(kind_of_layer(c, 0), layer_kind::embedding);
  EXPECT_EQ(kind_of_layer(c, 1), layer_kind::block);
  EXPECT_EQ(kind_of_layer(c, 2), layer_kind::block);
  EXPECT_EQ(kind_of_layer(c, 3), layer_kind::block);
  EXPECT_EQ(kind_of_layer(c, 4), layer_kind::head);
  EXPECT_THROW(kind_of_layer(c, -1), internal_error);
  EXPECT_THROW(kind_of_layer(c, 5), internal_error);
  EXPECT_EQ(to_string(layer_kind::embedding), "embedding");
  EXPECT_EQ(to_string(layer_kind::block), "block");
  EXPECT_EQ(to_string(layer_kind::head), "head");
}

TEST(core_model_config, parameter_counts_match_the_hand_formula) {
  auto c = small();
  // Embedding: token table V x d plus position table T x d.
  EXPECT_EQ(layer_parameters(c, 0), 11 * 8 + 7 * 8); // 144
  // Block: attention 4 d^2 + 4 d (qkv and proj with biases), MLP
  // 2 d f + f + d, two LayerNorms 4 d.
  const std::int64_t block = 4 * 8 * 8 + 4 * 8 + 2 * 8 * 32 + 32 + 8 + 4 * 8;
  EXPECT_EQ(block, 872);
  for (int l = 1; l <= 3; ++l)
    EXPECT_EQ(layer_parameters(c, l), block) << l;
  // Head: final LayerNorm 2 d plus an untied, bias-free LM head V x d.
  EXPECT_EQ(layer_parameters(c, 4), 2 * 8 + 11 * 8); // 104
  EXPECT_EQ(model_parameters(c), 144 + 3 * 872 + 104);
  EXPECT_THROW(layer_parameters(c, 5), internal_error);
}

TEST(core_model_config, llama_counts_and_flops) {
  auto c = small(); // V 11, T 7, d 8, 2 heads of 4, 3 blocks, f 32
  c.family = model_family::llama;
  c.n_kv_head = 1; // k and v are 4 x 8
  // Embedding: the token table only (rotary positions).
  EXPECT_EQ(layer_parameters(c, 0), 11 * 8);
  // Block: q and o d x d, k and v (kv heads x head width) x d, gate, up
  // and down d x f, two RMSNorm gains; no biases.
  const std::int64_t block = 2 * 8 * 8 + 2 * 4 * 8 + 3 * 8 * 32 + 2 * 8;
  for (int l = 1; l <= 3; ++l)
    EXPECT_EQ(layer_parameters(c, l), block) << l;
  EXPECT_EQ(layer_parameters(c, 4), 8 + 11 * 8);
  const double n = 2 * c.seq_len;
  auto w = compute_layer_work(c, 2, 2, dtype::fp32);
  EXPECT_EQ(w.parameters, block);
  EXPECT_DOUBLE_EQ(w.forward_flops,
                   2 * n * (2.0 * 8 * 8 + 2.0 * 8 * 4 + 3.0 * 8 * 32) +
                     2 * 2 * n * c.seq_len * 8);
  EXPECT_DOUBLE_EQ(w.weight_gradient_flops,
                   2 * n * (2.0 * 8 * 8 + 2.0 * 8 * 4 + 3.0 * 8 * 32));
}

TEST(core_model_config, block_work_counts_flops) {
  auto c = small();
  const int b = 2;
  const double n = b * c.seq_len; // 14 tokens
  auto w = compute_layer_work(c, 2, b, dtype::fp32);
  EXPECT_EQ(w.kind, layer_kind::block);
  EXPECT_EQ(w.rows, n);
  EXPECT_EQ(w.parameters, 872);
  // Two FLOPs per multiply-add: qkv (3 d^2) + proj (d^2) + MLP (2 d f) per
  // token, plus scores and weighted sum (2 x 2 T d per token) in full.
  const double gemm = 2 * n * (4.0 * 8 * 8 + 2.0 * 8 * 32); // 21504
  const double attention = 2 * 2 * n * c.seq_len * 8;       // 3136
  EXPECT_DOUBLE_EQ(w.forward_flops, gemm + attention);
  EXPECT_DOUBLE_EQ(w.forward_flops, 24640);
  EXPECT_DOUBLE_EQ(w.backward_flops, 2 * w.forward_flops);
  EXPECT_GT(w.forward_bytes, 872.0 * 4); // at least the weights once
  EXPECT_GT(w.backward_bytes, w.forward_bytes);

  // Half the bytes per element, the same FLOPs.
  auto h = compute_layer_work(c, 2, b, dtype::bf16);
  EXPECT_EQ(h.forward_flops, w.forward_flops);
  EXPECT_EQ(h.backward_flops, w.backward_flops);
  EXPECT_DOUBLE_EQ(h.forward_bytes, w.forward_bytes / 2);
  EXPECT_DOUBLE_EQ(h.backward_bytes, w.backward_bytes / 2);

  // Linear in the micro-batch size (attention is per sequence).
  auto w4 = compute_layer_work(c, 2, 4, dtype::fp32);
  EXPECT_DOUBLE_EQ(w4.forward_flops, 2 * w.forward_flops);
  EXPECT_EQ(w4.rows, 2 * n);
}

TEST(core_model_config, head_and_embedding_work) {
  auto c = small();
  const double n = 3 * c.seq_len;
  auto head = compute_layer_work(c, 4, 3, dtype::fp32);
  EXPECT_EQ(head.kind, layer_kind::head);
  EXPECT_EQ(head.parameters, 104);
  // The LM head GEMM dominates: 2 n d V.
  EXPECT_GE(head.forward_flops, 2 * n * 8 * 11);
  EXPECT_GE(head.backward_flops, 4 * n * 8 * 11);
  auto emb = compute_layer_work(c, 0, 3, dtype::fp32);
  EXPECT_EQ(emb.kind, layer_kind::embedding);
  EXPECT_EQ(emb.parameters, 144);
  EXPECT_LT(emb.forward_flops, head.forward_flops); // a gather, not a GEMM
}

TEST(core_model_config, training_flops_sums_every_layer) {
  auto c = small();
  double per_sequence = 0;
  for (int l = 0; l < c.num_layers(); ++l) {
    auto w = compute_layer_work(c, l, 1, dtype::fp32);
    per_sequence += w.forward_flops + w.backward_flops;
  }
  const double tokens = 5 * c.seq_len;
  EXPECT_NEAR(training_flops(c, tokens), per_sequence * 5,
              1e-9 * per_sequence * 5);
  // The 6N rule over the matrix parameters is a lower bound.
  const double matrix_params = 3 * (4.0 * 8 * 8 + 2.0 * 8 * 32) + 11.0 * 8;
  EXPECT_GT(training_flops(c, tokens), 6 * matrix_params * tokens);
}

} // namespace
} // namespace h2
