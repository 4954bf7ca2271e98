#include "h2/model/optim.hpp"

#include "h2/core/error.hpp"
#include "h2/model/ops.hpp"
#include "layer_parts.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <cmath>

namespace h2::model {

double learning_rate(const train_config& train, int step) noexcept {
  if (train.warmup_steps > 0 && step < train.warmup_steps)
    return train.lr * static_cast<double>(step + 1) / train.warmup_steps;
  int decay = train.decay_steps > 0 ? train.decay_steps
                                    : train.steps - train.warmup_steps;
  int into = step - train.warmup_steps;
  if (decay <= 0 || into >= decay)
    return train.min_lr;
  double progress = static_cast<double>(into) / decay;
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return train.min_lr + (train.lr - train.min_lr) * cosine;
}

double squared_grad_norm(const layer& l) {
  double sum = 0;
  for (auto& p : l.parameters()) {
    const auto& g = p.value.grad();
    if (!g.defined() || p.tied)
      continue;
    sum += g.to(at::kDouble).square().sum().item<double>();
  }
  return sum;
}

at::Tensor tied_gradient(const at::Tensor& embedding_grad,
                         const at::Tensor& head_grad, const at::Tensor& like) {
  at::NoGradGuard no_grad;
  const auto e =
    embedding_grad.defined() ? embedding_grad : at::zeros_like(like);
  const auto h = head_grad.defined() ? head_grad : at::zeros_like(like);
  return e + h;
}

parameter* tied_weight(layer& l) {
  for (auto& p : l.parameters())
    if (p.tied || p.name == "embedding.wte")
      return &p;
  return nullptr;
}

double global_grad_norm(const std::vector<double>& squared_norms_in_order) {
  double sum = 0;
  for (double s : squared_norms_in_order)
    sum += s;
  return std::sqrt(sum);
}

double clip_coefficient(double grad_norm, double clip) noexcept {
  if (clip <= 0 || !std::isfinite(grad_norm))
    return 1.0;
  return std::min(1.0, clip / (grad_norm + 1e-6));
}

void adamw_update(layer& l, const train_config& train, double lr, int step,
                  double grad_scale) {
  H2_ENFORCE(step >= 1, "step=", step);
  // A parameter without a gradient is left alone, with no moments
  // (PyTorch's AdamW); the others get theirs one by one then.
  const auto& params = l.parameters();
  if (std::all_of(params.begin(), params.end(),
                  [](const parameter& p) { return p.value.grad().defined(); }))
    make_moments(l);
  for (auto& p : l.parameters())
    ops::adamw(p, train, lr, step, grad_scale);
}

void make_moments(layer& l, at::Tensor flat) {
  auto& params = l.parameters();
  auto length = [](const parameter& p) {
    return p.shard_length >= 0 ? p.shard_length : p.value.numel();
  };
  auto shape_of = [&](const parameter& p) {
    return p.shard_length >= 0 ? std::vector<std::int64_t>{length(p)}
                               : p.value.sizes().vec();
  };
  if (!flat.defined() &&
      std::any_of(params.begin(), params.end(),
                  [](const parameter& p) { return p.exp_avg.defined(); })) {
    // Some have theirs (a parameter once without a gradient): the others
    // get their own, and nobody's are reset.
    for (auto& p : params)
      if (!p.exp_avg.defined()) {
        p.exp_avg = at::zeros(shape_of(p), p.value.options());
        p.exp_avg_sq = at::zeros_like(p.exp_avg);
      }
    return;
  }
  if (params.empty())
    return;
  std::int64_t total = 0;
  for (const auto& p : params)
    total += 2 * length(p);
  if (!flat.defined())
    flat =
      at::zeros({total}, params.front().value.options().requires_grad(false));
  H2_ENFORCE(flat.scalar_type() == at::kFloat && flat.dim() == 1 &&
               flat.numel() == total && flat.is_contiguous(),
             "layer ", l.index(), ": the moments are ", total,
             " contiguous fp32 values");
  std::int64_t at = 0;
  for (auto& p : params) {
    const auto n = length(p);
    p.exp_avg = detail::slot(flat, at, shape_of(p));
    p.exp_avg_sq = detail::slot(flat, at + n, shape_of(p));
    at += 2 * n;
  }
}

} // namespace h2::model
