#include "h2/model/ops.hpp"

#include "h2/core/error.hpp"
#include "h2/devices/bf16_gemm.hpp"
#include "h2/model/layers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/zeros_like.h>

#include <cmath>

namespace h2::model::ops {

at::Tensor embedding(const at::Tensor& wte, const at::Tensor& wpe,
                     const at::Tensor& tokens) {
  H2_ENFORCE(tokens.defined() && tokens.dim() == 2,
             "embedding needs [B, T] tokens");
  return at::embedding(wte, tokens) + wpe.narrow(0, 0, tokens.size(1));
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias) {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, layer_norm_eps);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias) {
  if (devices::bf16_gemm::active())
    return devices::bf16_gemm::linear(x, weight, bias);
  return at::linear(x, weight, bias);
}

at::Tensor gelu(const at::Tensor& x) {
  return at::gelu(x);
}

at::Tensor softmax(const at::Tensor& x) {
  return at::softmax(x, -1, x.scalar_type());
}

at::Tensor causal_mask(std::int64_t t, c10::Device device) {
  return at::ones({t, t}, at::TensorOptions(at::kBool).device(device)).triu(1);
}

namespace {

/// a @ b, as the chip's bf16 GEMM path computes it (devices/bf16_gemm.hpp).
at::Tensor product(const at::Tensor& a, const at::Tensor& b) {
  if (devices::bf16_gemm::active())
    return devices::bf16_gemm::matmul(a, b);
  return at::matmul(a, b);
}

} // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& mask) {
  const auto hd = static_cast<double>(q.size(-1));
  auto scores = product(q, k.transpose(-2, -1)) / std::sqrt(hd);
  scores = scores.masked_fill(mask, -INFINITY);
  return product(softmax(scores), v);
}

at::Tensor cross_entropy_sum(const at::Tensor& logits,
                             const at::Tensor& targets) {
  // fp32 at least: fp64 stays fp64 (the operator check's reference).
  const auto wide =
    logits.scalar_type() == at::kDouble ? logits : logits.to(at::kFloat);
  return at::cross_entropy_loss(wide, targets, {}, at::Reduction::Sum);
}

void adamw(parameter& p, const train_config& train, double lr, int step,
           double grad_scale) {
  H2_ENFORCE(step >= 1, "step=", step);
  auto g = p.value.grad();
  if (!g.defined())
    return;
  const double bias1 = 1.0 - std::pow(train.beta1, step);
  const double bias2 = 1.0 - std::pow(train.beta2, step);
  const double step_size = lr / bias1;
  const double bias2_sqrt = std::sqrt(bias2);
  at::NoGradGuard no_grad;
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

} // namespace h2::model::ops
