// The llama family (model/llama.cpp): its parameters are what core/ counts,
// its block computes what an independent transcription of Hugging Face's
// LlamaDecoderLayer computes (RMSNorm, rotate-half RoPE, repeat_kv, SwiGLU),
// grouped-query attention is attention over repeated key/value heads, and
// rotary positions make attention depend on relative positions only.
#include "h2/model/layers.hpp"
#include "h2/model/ops.hpp"
#include "h2/model/stage.hpp"

#include "test_jobs.hpp"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

namespace h2::model {
namespace {

/// A llama of 3 blocks: 4 query heads of width 4 over 2 key/value heads.
gpt_config llama_shape(int n_kv_head = 2) {
  auto c = test::gpt_shape(23, 8, 16, 4, 3, 40);
  c.family = model_family::llama;
  c.n_kv_head = n_kv_head;
  c.rope_theta = 500.0;
  c.norm_eps = 1e-6;
  return c;
}

micro_batch llama_batch(const gpt_config& c, int sequences) {
  micro_batch mb;
  mb.tokens = at::arange(sequences * c.seq_len, at::kLong)
                .mul(7)
                .remainder(c.vocab_size)
                .view({sequences, c.seq_len});
  mb.targets = mb.tokens.roll(-1, 1);
  mb.loss_scale = 1.0 / (sequences * c.seq_len);
  return mb;
}

std::map<std::string, at::Tensor> by_name(const layer& l) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : l.parameters())
    out[p.name] = p.value.detach();
  return out;
}

TEST(model_llama, names_counts_and_decay) {
  const auto c = llama_shape();
  stage s(c, 0, c.num_layers(), 1);
  std::set<std::string> names;
  for (const auto& l : s.layers()) {
    EXPECT_EQ(l->parameter_count(), layer_parameters(c, l->index()))
      << to_string(l->kind());
    for (const auto& p : l->parameters()) {
      names.insert(p.name);
      EXPECT_EQ(p.decay, p.value.dim() == 2) << p.name;
    }
  }
  EXPECT_EQ(s.parameter_count(), model_parameters(c));
  EXPECT_EQ(names.size(), 1u + 3 * 9 + 2);
  auto p = by_name(*s.layers()[1]);
  EXPECT_EQ(p.at("block1.attn.q.weight").sizes(), (at::IntArrayRef{16, 16}));
  EXPECT_EQ(p.at("block1.attn.k.weight").sizes(), (at::IntArrayRef{8, 16}));
  EXPECT_EQ(p.at("block1.attn.v.weight").sizes(), (at::IntArrayRef{8, 16}));
  EXPECT_EQ(p.at("block1.mlp.gate.weight").sizes(), (at::IntArrayRef{40, 16}));
  EXPECT_EQ(p.at("block1.mlp.down.weight").sizes(), (at::IntArrayRef{16, 40}));
  EXPECT_TRUE(at::equal(p.at("block1.attn_norm.weight"), at::ones({16})));
  // The default MLP width: 8 d / 3 rounded up to a multiple of 64.
  EXPECT_EQ(default_llama_d_ff(16), 64);
  EXPECT_EQ(default_llama_d_ff(4096), 10944);
}

/// Hugging Face's LlamaDecoderLayer, written out here from its modelling
/// code in fp64: RMSNorm in wide precision, rotate_half RoPE on positions
/// 0..T-1, repeat_kv, softmax attention with a causal mask, SwiGLU.
at::Tensor reference_block(const gpt_config& c,
                           const std::map<std::string, at::Tensor>& w,
                           const std::string& p, const at::Tensor& x0) {
  auto W = [&](const std::string& n) {
    return w.at(p + n).to(at::kDouble);
  };
  const auto x = x0.to(at::kDouble);
  const std::int64_t b = x.size(0), t = x.size(1), h = c.n_head,
                     kvh = c.kv_heads(), hd = c.head_dim();
  auto rms = [&](const at::Tensor& v, const at::Tensor& g) {
    return g * (v / (v.pow(2).mean(-1, true) + c.norm_eps).sqrt());
  };
  auto inv_freq =
    1.0 / at::pow(c.rope_theta, at::arange(0, hd, 2, at::kDouble) / hd);
  auto freqs = at::outer(at::arange(t, at::kDouble), inv_freq);
  auto emb = at::cat({freqs, freqs}, -1);
  auto rotate_half = [&](const at::Tensor& v) {
    return at::cat({-v.narrow(-1, hd / 2, hd / 2), v.narrow(-1, 0, hd / 2)},
                   -1);
  };
  auto rope = [&](const at::Tensor& v) {
    return v * emb.cos() + rotate_half(v) * emb.sin();
  };
  auto n1 = rms(x, W("attn_norm.weight"));
  auto q =
    at::matmul(n1, W("attn.q.weight").t()).view({b, t, h, hd}).transpose(1, 2);
  auto k = at::matmul(n1, W("attn.k.weight").t())
             .view({b, t, kvh, hd})
             .transpose(1, 2);
  auto v = at::matmul(n1, W("attn.v.weight").t())
             .view({b, t, kvh, hd})
             .transpose(1, 2);
  q = rope(q);
  k = rope(k);
  // repeat_kv: [b, kvh, t, hd] -> [b, kvh, n_rep, t, hd] -> [b, h, t, hd]
  const auto n_rep = h / kvh;
  k = k.unsqueeze(2).expand({b, kvh, n_rep, t, hd}).reshape({b, h, t, hd});
  v = v.unsqueeze(2).expand({b, kvh, n_rep, t, hd}).reshape({b, h, t, hd});
  auto scores = at::matmul(q, k.transpose(2, 3)) / std::sqrt(double(hd));
  scores = scores.masked_fill(at::ones({t, t}, at::kBool).triu(1), -INFINITY);
  auto y =
    at::matmul(at::softmax(scores, -1), v).transpose(1, 2).reshape({b, t, -1});
  auto hidden = x + at::matmul(y, W("attn.o.weight").t());
  auto n2 = rms(hidden, W("mlp_norm.weight"));
  auto gate = at::matmul(n2, W("mlp.gate.weight").t());
  auto up = at::matmul(n2, W("mlp.up.weight").t());
  auto mlp = at::matmul(at::silu(gate) * up, W("mlp.down.weight").t());
  return hidden + mlp;
}

TEST(model_llama, block_matches_the_hugging_face_semantics) {
  for (int kv : {4, 2, 1}) {
    SCOPED_TRACE("n_kv_head " + std::to_string(kv));
    const auto c = llama_shape(kv);
    auto block = make_layer(c, 2, 9);
    auto w = by_name(*block);
    // Gains away from 1, so that a gain read as another is caught.
    for (auto& p : block->parameters())
      if (p.value.dim() == 1)
        p.value.detach().uniform_(0.5, 1.5);
    w = by_name(*block);
    const auto x = at::randn({2, c.seq_len, c.d_model});
    micro_batch mb;
    const auto out = block->forward(x, mb).to(at::kDouble);
    const auto ref = reference_block(c, w, "block2.", x);
    EXPECT_LT((out - ref).abs().max().item<double>(), 2e-5);
  }
}

TEST(model_llama, grouped_query_attention_is_attention_over_repeated_heads) {
  const auto grouped = llama_shape(2);
  const auto full = llama_shape(4);
  auto g = make_layer(grouped, 1, 3);
  auto f = make_layer(full, 1, 3);
  // The full block's key and value heads: each grouped head twice.
  auto gw = by_name(*g);
  for (auto& p : f->parameters()) {
    at::NoGradGuard no_grad;
    auto src = gw.at(p.name);
    if (p.name.ends_with("attn.k.weight") || p.name.ends_with("attn.v.weight"))
      src = src.view({2, 4, 16}).repeat_interleave(2, 0).reshape({16, 16});
    p.value.copy_(src);
  }
  const auto x = at::randn({2, 8, 16});
  micro_batch mb;
  EXPECT_TRUE(at::allclose(g->forward(x, mb), f->forward(x, mb), 1e-6, 1e-6));
}

TEST(model_llama, rotary_scores_depend_on_relative_positions_only) {
  const std::int64_t hd = 8, t = 12;
  const auto [cos, sin] = ops::rope_tables(t, hd, 10000.0, c10::kCPU);
  // One query and one key vector placed at every position.
  const auto qv = at::randn({hd}, at::kDouble),
             kv = at::randn({hd}, at::kDouble);
  const auto q =
    ops::rope(qv.expand({1, 1, t, hd}).contiguous(), cos, sin).to(at::kDouble);
  const auto k =
    ops::rope(kv.expand({1, 1, t, hd}).contiguous(), cos, sin).to(at::kDouble);
  auto score = [&](int m, int n) {
    return (q[0][0][m] * k[0][0][n]).sum().item<double>();
  };
  EXPECT_NEAR(score(3, 1), score(10, 8), 1e-5);
  EXPECT_NEAR(score(5, 5), score(0, 0), 1e-5);
  EXPECT_GT(std::abs(score(5, 1) - score(5, 5)), 1e-3);
  // Position 0 is not rotated.
  EXPECT_TRUE(at::allclose(q[0][0][0], qv, 1e-6, 1e-6));
}

TEST(model_llama, stages_split_anywhere_and_train_every_parameter) {
  const auto c = llama_shape();
  auto mb = llama_batch(c, 2);
  stage whole(c, 0, c.num_layers(), 5);
  stage first(c, 0, 2, 5), second(c, 2, c.num_layers(), 5);
  const auto loss = whole.forward({}, mb);
  EXPECT_TRUE(at::equal(loss, second.forward(first.forward({}, mb), mb)));
  // N(0, 0.02) weights: near-uniform predictions.
  EXPECT_NEAR(loss.item<double>(), std::log(23.0), 0.05);
  loss.backward();
  for (parameter* p : whole.parameters()) {
    ASSERT_TRUE(p->value.grad().defined()) << p->name;
    EXPECT_GT(p->value.grad().abs().sum().item<double>(), 0) << p->name;
  }
}

} // namespace
} // namespace h2::model
