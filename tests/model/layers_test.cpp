#include "h2/model/layers.hpp"
#include "h2/model/stage.hpp"

#include "h2/core/error.hpp"

#include "test_jobs.hpp"
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace h2::model {
namespace {

gpt_config small() {
  return test::gpt_shape(17, 8, 16, 2, 4, 32);
}

/// Deterministic tokens and their next-token targets.
micro_batch sample_batch(const gpt_config& c, int sequences,
                         double loss_scale) {
  micro_batch mb;
  mb.tokens = at::empty({sequences, c.seq_len}, at::kLong);
  mb.targets = at::empty({sequences, c.seq_len}, at::kLong);
  auto* in = mb.tokens.data_ptr<std::int64_t>();
  auto* out = mb.targets.data_ptr<std::int64_t>();
  for (int i = 0; i < sequences * c.seq_len; ++i) {
    in[i] = (i * 7 + 3) % c.vocab_size;
    out[i] = (i * 5 + 1) % c.vocab_size;
  }
  mb.loss_scale = loss_scale;
  return mb;
}

std::map<std::string, at::Tensor> parameters_by_name(stage& s) {
  std::map<std::string, at::Tensor> out;
  for (parameter* p : s.parameters())
    out[p->name] = p->value;
  return out;
}

TEST(model_layers, kinds_names_and_counts) {
  auto c = small();
  stage s(c, 0, c.num_layers(), 1);
  ASSERT_EQ(s.layers().size(), 6u);
  EXPECT_TRUE(s.has_embedding());
  EXPECT_TRUE(s.has_head());
  std::set<std::string> names;
  for (const auto& l : s.layers()) {
    EXPECT_EQ(l->kind(), kind_of_layer(c, l->index()));
    // The model's parameters are exactly what core/ counts for planning.
    EXPECT_EQ(l->parameter_count(), layer_parameters(c, l->index()))
      << to_string(l->kind()) << " " << l->index();
    for (const auto& p : l->parameters()) {
      EXPECT_TRUE(names.insert(p.name).second) << "duplicate " << p.name;
      EXPECT_EQ(p.value.scalar_type(), at::kFloat) << p.name;
      EXPECT_TRUE(p.value.requires_grad()) << p.name;
      EXPECT_FALSE(p.exp_avg.defined()) << p.name;
      // Decay on matrices only, never on biases or LayerNorm gains.
      EXPECT_EQ(p.decay, p.value.dim() == 2) << p.name;
    }
  }
  EXPECT_EQ(s.parameter_count(), model_parameters(c));
  EXPECT_TRUE(names.count("block3.attn.qkv.weight"));
  EXPECT_TRUE(names.count("embedding.wte"));
  EXPECT_TRUE(names.count("head.lm_head.weight"));
}

TEST(model_layers, weights_depend_only_on_seed_and_layer_index) {
  auto c = small();
  stage full(c, 0, c.num_layers(), 42);
  stage part(c, 2, 5, 42);
  EXPECT_FALSE(part.has_embedding());
  EXPECT_FALSE(part.has_head());
  auto all = parameters_by_name(full);
  auto some = parameters_by_name(part);
  ASSERT_EQ(some.size(), 3u * 12);
  for (const auto& [name, value] : some) {
    ASSERT_TRUE(all.count(name)) << name;
    EXPECT_TRUE(at::equal(value, all[name])) << name; // bitwise
  }
  // A layer built on its own, too.
  auto alone = make_layer(c, 3, 42);
  for (const auto& p : alone->parameters())
    EXPECT_TRUE(at::equal(p.value, all[p.name])) << p.name;
}

TEST(model_layers, a_layers_values_are_slices_of_one_buffer_in_order) {
  auto c = small();
  for (int index : {0, 3, c.num_layers() - 1}) {
    auto l = make_layer(c, index, 42);
    const auto flat = flat_values(*l);
    ASSERT_EQ(flat.numel(), layer_parameters(c, index));
    EXPECT_FALSE(flat.requires_grad());
    const auto* base = flat.data_ptr<float>();
    std::int64_t at = 0;
    for (const auto& p : l->parameters()) {
      EXPECT_EQ(p.value.data_ptr<float>(), base + at) << p.name; // no copy
      EXPECT_TRUE(p.value.is_leaf()) << p.name;
      at += p.value.numel();
    }
    // A layer built over those values is the same layer, sharing them.
    auto over = make_layer(c, index, initial_weights::over(flat));
    for (std::size_t i = 0; i < l->parameters().size(); ++i)
      EXPECT_EQ(over->parameters()[i].value.data_ptr(),
                l->parameters()[i].value.data_ptr());
  }
  // Parameters that are not one buffer any more are packed.
  auto l = make_layer(c, 2, 42);
  const auto before = flat_values(*l).clone();
  auto& first = l->parameters().front().value;
  first = first.detach().clone().requires_grad_(true);
  const auto packed = flat_values(*l);
  EXPECT_NE(packed.data_ptr(), first.data_ptr());
  EXPECT_TRUE(at::equal(packed, before));
}

TEST(model_layers, drawing_into_a_slice_gives_a_tensors_own_bits) {
  // What the initializer relies on: normal_ fills a contiguous fp32 tensor
  // by its size alone, wherever it starts.
  for (std::int64_t n : {5, 16, 17, 1000}) {
    auto own = at::empty({n});
    own.normal_(0.0, 0.02, at::make_generator<at::CPUGeneratorImpl>(7));
    auto buffer = at::zeros({n + 3});
    auto slice = buffer.narrow(0, 3, n);
    slice.normal_(0.0, 0.02, at::make_generator<at::CPUGeneratorImpl>(7));
    EXPECT_TRUE(at::equal(own, slice)) << n;
  }
}

TEST(model_layers, seed_changes_the_weights) {
  auto c = small();
  stage a(c, 0, c.num_layers(), 42);
  stage b(c, 0, c.num_layers(), 43);
  auto pa = parameters_by_name(a);
  auto pb = parameters_by_name(b);
  int random = 0;
  for (parameter* p : a.parameters()) {
    if (!p->decay)
      continue; // ones and zeros do not depend on the seed
    ++random;
    EXPECT_FALSE(at::equal(pa[p->name], pb[p->name])) << p->name;
  }
  EXPECT_EQ(random, 2 + 4 * 4 + 1);
  // Different layers of one seed differ as well.
  EXPECT_FALSE(
    at::equal(pa["block1.attn.qkv.weight"], pa["block2.attn.qkv.weight"]));
}

TEST(model_layers, gpt2_initialisation_scales) {
  auto c = small();
  stage s(c, 0, c.num_layers(), 7);
  auto p = parameters_by_name(s);
  EXPECT_TRUE(at::equal(p["block1.ln1.weight"], at::ones({16})));
  EXPECT_TRUE(at::equal(p["block1.attn.qkv.bias"], at::zeros({48})));
  // Residual projections are scaled by 1/sqrt(2 n_layer).
  double qkv_std = p["block1.attn.qkv.weight"].std().item<double>();
  double proj_std = p["block1.mlp.fc2.weight"].std().item<double>();
  EXPECT_NEAR(qkv_std, 0.02, 0.002); // 768 samples
  EXPECT_NEAR(proj_std, 0.02 / std::sqrt(8.0), 0.001);
}

TEST(model_stage, split_forward_equals_full_forward) {
  auto c = small();
  micro_batch mb = sample_batch(c, 2, 1.0 / 16);
  stage full(c, 0, c.num_layers(), 5);
  stage first(c, 0, 2, 5);
  stage second(c, 2, c.num_layers(), 5);
  at::Tensor whole = full.forward({}, mb);
  at::Tensor act = first.forward({}, mb);
  EXPECT_EQ(act.sizes(), (at::IntArrayRef{2, c.seq_len, c.d_model}));
  at::Tensor split = second.forward(act, mb);
  EXPECT_TRUE(at::equal(whole, split));
}

TEST(model_stage, last_stage_loss_is_the_cross_entropy_of_the_logits) {
  auto c = small();
  const int b = 2;
  const double scale = 1.0 / (b * c.seq_len);
  micro_batch mb = sample_batch(c, b, scale);
  stage body(c, 0, c.num_layers() - 1, 11);
  stage head(c, c.num_layers() - 1, c.num_layers(), 11);
  at::Tensor x = body.forward({}, mb);
  at::Tensor loss = head.forward(x, mb);
  ASSERT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);

  // The logits from the head's own weights; the loss by hand, in double.
  auto& hp = head.layers()[0]->parameters();
  ASSERT_EQ(hp.size(), 3u);
  ASSERT_EQ(hp[0].name, "head.ln_f.weight");
  ASSERT_EQ(hp[1].name, "head.ln_f.bias");
  ASSERT_EQ(hp[2].name, "head.lm_head.weight");
  at::Tensor logits =
    at::linear(at::layer_norm(x, {c.d_model}, hp[0].value, hp[1].value),
               hp[2].value)
      .reshape({-1, c.vocab_size})
      .to(at::kDouble)
      .contiguous();
  at::Tensor targets = mb.targets.reshape({-1}).contiguous();
  const double* z = logits.data_ptr<double>();
  const std::int64_t* y = targets.data_ptr<std::int64_t>();
  double sum = 0;
  for (int r = 0; r < b * c.seq_len; ++r) {
    const double* row = z + r * c.vocab_size;
    double m = row[0];
    for (int v = 1; v < c.vocab_size; ++v)
      m = std::max(m, row[v]);
    double s = 0;
    for (int v = 0; v < c.vocab_size; ++v)
      s += std::exp(row[v] - m);
    sum += m + std::log(s) - row[y[r]];
  }
  EXPECT_NEAR(loss.item<double>(), sum * scale, 1e-6);

  // loss_scale multiplies the summed token losses.
  mb.loss_scale = 1.0;
  EXPECT_NEAR(head.forward(x, mb).item<double>(), sum, 1e-5);

  // head_logits, the logits h2-export --logits writes (docs/export.md), are
  // these logits, bit for bit; only the head has them.
  at::Tensor direct = head_logits(*head.layers()[0], x);
  EXPECT_EQ(direct.sizes(), (at::IntArrayRef{b, c.seq_len, c.vocab_size}));
  EXPECT_TRUE(at::equal(direct.reshape({-1, c.vocab_size}).to(at::kDouble),
                        logits));
  EXPECT_THROW(head_logits(*body.layers()[1], x), internal_error);
}

TEST(model_stage, fresh_model_loss_is_close_to_ln_vocab) {
  auto c = small();
  micro_batch mb = sample_batch(c, 4, 1.0 / (4 * c.seq_len));
  stage full(c, 0, c.num_layers(), 3);
  double loss = full.forward({}, mb).item<double>();
  // N(0, 0.02) weights: near-uniform predictions.
  EXPECT_NEAR(loss, std::log(17.0), 0.05);
}

TEST(model_stage, backward_reaches_every_parameter_and_zero_grad_frees) {
  auto c = small();
  micro_batch mb = sample_batch(c, 2, 1.0 / 16);
  stage full(c, 0, c.num_layers(), 3);
  full.forward({}, mb).backward();
  for (parameter* p : full.parameters()) {
    ASSERT_TRUE(p->value.grad().defined()) << p->name;
    EXPECT_EQ(p->value.grad().sizes(), p->value.sizes()) << p->name;
  }
  full.zero_grad();
  for (parameter* p : full.parameters())
    EXPECT_FALSE(p->value.grad().defined()) << p->name;
}

TEST(model_stage, rejects_bad_ranges) {
  auto c = small();
  EXPECT_THROW(stage(c, 2, 2, 0), internal_error);
  EXPECT_THROW(stage(c, -1, 2, 0), internal_error);
  EXPECT_THROW(stage(c, 0, c.num_layers() + 1, 0), internal_error);
  EXPECT_THROW(make_layer(c, c.num_layers(), 0), internal_error);
}

} // namespace
} // namespace h2::model
