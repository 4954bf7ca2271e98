#include "h2/model/optim.hpp"

#include "h2/core/error.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/zeros_like.h>

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
    if (!g.defined())
      continue;
    sum += g.to(at::kDouble).square().sum().item<double>();
  }
  return sum;
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
  const double bias1 = 1.0 - std::pow(train.beta1, step);
  const double bias2 = 1.0 - std::pow(train.beta2, step);
  const double step_size = lr / bias1;
  const double bias2_sqrt = std::sqrt(bias2);
  at::NoGradGuard no_grad;
  for (auto& p : l.parameters()) {
    auto g = p.value.grad();
    if (!g.defined())
      continue;
    if (grad_scale != 1.0)
      g.mul_(grad_scale);
    if (!p.exp_avg.defined()) {
      p.exp_avg = at::zeros_like(p.value);
      p.exp_avg_sq = at::zeros_like(p.value);
    }
    if (p.decay && train.weight_decay > 0)
      p.value.mul_(1.0 - lr * train.weight_decay);
    p.exp_avg.mul_(train.beta1).add_(g, 1.0 - train.beta1);
    p.exp_avg_sq.mul_(train.beta2).addcmul_(g, g, 1.0 - train.beta2);
    auto denom = (p.exp_avg_sq.sqrt() / bias2_sqrt).add_(train.eps);
    p.value.addcdiv_(p.exp_avg, denom, -step_size);
  }
}

} // namespace h2::model
