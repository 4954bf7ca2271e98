#include "h2/model/optim.hpp"

#include "h2/core/error.hpp"
#include "test_jobs.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace h2::model {
namespace {

train_config schedule(int steps, int warmup, int decay) {
  train_config t;
  t.steps = steps;
  t.lr = 1e-3;
  t.min_lr = 1e-4;
  t.warmup_steps = warmup;
  t.decay_steps = decay;
  return t;
}

TEST(model_lr, linear_warmup) {
  auto t = schedule(110, 10, 0);
  EXPECT_DOUBLE_EQ(learning_rate(t, 0), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 4), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 9), 1e-3);
}

TEST(model_lr, cosine_decay_to_the_floor) {
  auto t = schedule(110, 10, 0); // decays over the remaining 100 steps
  EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(t, 60), 1e-4 + 0.5 * (1e-3 - 1e-4));
  EXPECT_DOUBLE_EQ(learning_rate(t, 35),
                   1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + std::cos(M_PI / 4)));
  EXPECT_DOUBLE_EQ(learning_rate(t, 110), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 1000), 1e-4);
  double prev = learning_rate(t, 10);
  for (int s = 11; s <= 110; ++s) {
    double lr = learning_rate(t, s);
    EXPECT_LE(lr, prev) << s;
    EXPECT_GE(lr, 1e-4) << s;
    prev = lr;
  }
}

TEST(model_lr, explicit_decay_steps_and_no_warmup) {
  auto t = schedule(1000, 0, 50);
  EXPECT_DOUBLE_EQ(learning_rate(t, 0), 1e-3);
  EXPECT_DOUBLE_EQ(learning_rate(t, 25), 5.5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 50), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(t, 999), 1e-4);
}

TEST(model_clip, coefficient) {
  EXPECT_DOUBLE_EQ(clip_coefficient(2.0, 1.0), 1.0 / (2.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clip_coefficient(10.0, 0.5), 0.5 / (10.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(100.0, 0.0), 1.0); // clipping off
}

/// A layer of hand-picked one-element parameters: `w` (decayed), `b` (not
/// decayed) and `frozen` (never gets a gradient).
class tiny_layer final : public layer {
public:
  tiny_layer() : layer(1, layer_kind::block) {
    add("w", at::full({1}, 0.5, at::kFloat), true);
    add("b", at::full({1}, -0.3, at::kFloat), false);
    add("frozen", at::full({2}, 2.0, at::kFloat), true);
  }
  at::Tensor forward(const at::Tensor& x, const micro_batch&) override {
    return x;
  }
  parameter& p(int i) { return parameters()[i]; }
};

void set_grad(parameter& p, std::vector<float> values) {
  p.value.mutable_grad() = at::tensor(at::ArrayRef<float>(values), at::kFloat)
                             .reshape(p.value.sizes());
}

/// PyTorch's AdamW (torch.optim.AdamW, the single-tensor path) for one
/// scalar, in double.
struct reference_adamw {
  double value, m = 0, v = 0;
  bool decay;

  void step(double g, double lr, int t, const train_config& c) {
    if (decay)
      value *= 1 - lr * c.weight_decay;
    m = c.beta1 * m + (1 - c.beta1) * g;
    v = c.beta2 * v + (1 - c.beta2) * g * g;
    double bc1 = 1 - std::pow(c.beta1, t);
    double bc2 = 1 - std::pow(c.beta2, t);
    double denom = std::sqrt(v) / std::sqrt(bc2) + c.eps;
    value -= lr / bc1 * m / denom;
  }
};

TEST(model_adamw, matches_pytorch_semantics_for_three_steps) {
  train_config c;
  c.beta1 = 0.9;
  c.beta2 = 0.95;
  c.eps = 1e-8;
  c.weight_decay = 0.1;
  tiny_layer l;
  reference_adamw w{0.5, 0, 0, true}, b{-0.3, 0, 0, false};
  const double lrs[] = {1e-2, 5e-3, 2e-2};
  const double scales[] = {1.0, 0.5, 1.0};
  const float gw[] = {0.2f, -0.1f, 0.05f};
  const float gb[] = {0.3f, 0.3f, -0.2f};
  for (int t = 1; t <= 3; ++t) {
    set_grad(l.p(0), {gw[t - 1]});
    set_grad(l.p(1), {gb[t - 1]});
    adamw_update(l, c, lrs[t - 1], t, scales[t - 1]);
    w.step(static_cast<double>(gw[t - 1]) * scales[t - 1], lrs[t - 1], t, c);
    b.step(static_cast<double>(gb[t - 1]) * scales[t - 1], lrs[t - 1], t, c);
    SCOPED_TRACE(t);
    EXPECT_NEAR(l.p(0).value.item<double>(), w.value, 1e-6);
    EXPECT_NEAR(l.p(1).value.item<double>(), b.value, 1e-6);
    EXPECT_NEAR(l.p(0).exp_avg.item<double>(), w.m, 1e-7);
    EXPECT_NEAR(l.p(0).exp_avg_sq.item<double>(), w.v, 1e-8);
    EXPECT_NEAR(l.p(1).exp_avg.item<double>(), b.m, 1e-7);
  }
  // The update moved both away from where weight decay alone would.
  EXPECT_NE(l.p(0).value.item<double>(), 0.5);
  // No gradient: untouched, no optimizer state, no weight decay.
  EXPECT_TRUE(at::equal(l.p(2).value, at::full({2}, 2.0, at::kFloat)));
  EXPECT_FALSE(l.p(2).exp_avg.defined());
  // A fourth step where every parameter has a gradient: the moments the
  // others have keep going, the third's start from zero.
  set_grad(l.p(0), {0.1f});
  set_grad(l.p(1), {0.1f});
  set_grad(l.p(2), {0.1f, 0.1f});
  adamw_update(l, c, 1e-2, 4, 1.0);
  w.step(0.1, 1e-2, 4, c);
  EXPECT_NEAR(l.p(0).exp_avg.item<double>(), w.m, 1e-7);
  EXPECT_NEAR(l.p(0).exp_avg_sq.item<double>(), w.v, 1e-8);
  EXPECT_NEAR(l.p(2).exp_avg[0].item<double>(), 0.1 * 0.1, 1e-7);
}

TEST(model_adamw, moments_survive_a_first_parameter_without_gradient) {
  train_config c;
  tiny_layer l;
  set_grad(l.p(1), {0.3f}); // the first parameter has none yet
  adamw_update(l, c, 1e-2, 1, 1.0);
  EXPECT_FALSE(l.p(0).exp_avg.defined());
  const double m1 = l.p(1).exp_avg.item<double>();
  EXPECT_NEAR(m1, (1 - c.beta1) * 0.3, 1e-7);
  set_grad(l.p(0), {0.2f});
  set_grad(l.p(1), {0.3f});
  set_grad(l.p(2), {0.1f, 0.1f});
  adamw_update(l, c, 1e-2, 2, 1.0);
  EXPECT_NEAR(l.p(1).exp_avg.item<double>(), c.beta1 * m1 + (1 - c.beta1) * 0.3,
              1e-7); // not reset
  EXPECT_NEAR(l.p(0).exp_avg.item<double>(), (1 - c.beta1) * 0.2, 1e-7);
}

TEST(model_adamw, a_layers_moments_are_one_buffer_in_order) {
  auto c = test::gpt_shape(17, 8, 16, 2, 4, 32);
  train_config t;
  auto l = make_layer(c, 2, 42);
  EXPECT_FALSE(flat_moments(*l).defined()); // before the first update
  for (auto& p : l->parameters())
    p.value.mutable_grad() = at::ones_like(p.value);
  adamw_update(*l, t, 1e-3, 1, 1.0);
  const auto flat = flat_moments(*l);
  ASSERT_EQ(flat.numel(), 2 * layer_parameters(c, 2));
  const auto* base = flat.data_ptr<float>();
  std::int64_t at = 0;
  for (const auto& p : l->parameters()) {
    EXPECT_EQ(p.exp_avg.data_ptr<float>(), base + at) << p.name;
    EXPECT_EQ(p.exp_avg_sq.data_ptr<float>(), base + at + p.value.numel())
      << p.name;
    EXPECT_EQ(p.exp_avg.sizes(), p.value.sizes()) << p.name;
    at += 2 * p.value.numel();
  }
  // Given moments become the layer's, in that order.
  auto moved = make_layer(c, 2, 42);
  make_moments(*moved, flat);
  for (std::size_t i = 0; i < moved->parameters().size(); ++i)
    EXPECT_TRUE(at::equal(moved->parameters()[i].exp_avg_sq,
                          l->parameters()[i].exp_avg_sq));
  EXPECT_EQ(flat_moments(*moved).data_ptr(), flat.data_ptr());
}

TEST(model_adamw, weight_decay_only_on_decay_parameters) {
  // With a zero gradient the Adam step is zero: only decay moves values.
  train_config c;
  c.weight_decay = 0.5;
  tiny_layer l;
  set_grad(l.p(0), {0.0f});
  set_grad(l.p(1), {0.0f});
  adamw_update(l, c, 0.1, 1, 1.0);
  EXPECT_FLOAT_EQ(l.p(0).value.item<float>(), 0.5f * (1 - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(l.p(1).value.item<float>(), -0.3f);
}

TEST(model_adamw, rejects_step_zero) {
  tiny_layer l;
  set_grad(l.p(0), {1.0f});
  EXPECT_THROW(adamw_update(l, train_config{}, 1e-3, 0, 1.0), internal_error);
}

TEST(model_grad_norm, squared_norm_of_a_layer) {
  tiny_layer l;
  EXPECT_EQ(squared_grad_norm(l), 0.0); // no gradients yet
  set_grad(l.p(0), {3.0f});
  EXPECT_EQ(squared_grad_norm(l), 9.0);
  set_grad(l.p(2), {1.0f, 2.0f});
  EXPECT_EQ(squared_grad_norm(l), 14.0);
  set_grad(l.p(1), {0.1f});
  // Accumulated in fp64 from the fp32 gradient.
  EXPECT_DOUBLE_EQ(squared_grad_norm(l),
                   14.0 + static_cast<double>(0.1f) * 0.1f);
}

TEST(model_grad_norm, global_norm_from_layer_squares) {
  EXPECT_EQ(global_grad_norm({9.0, 16.0}), 5.0);
  EXPECT_EQ(global_grad_norm({}), 0.0);
  EXPECT_EQ(global_grad_norm({0.0, 4.0, 0.0}), 2.0);
}

} // namespace
} // namespace h2::model
