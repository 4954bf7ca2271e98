#include "h2/model/ops.hpp"

#include "h2/core/error.hpp"
#include "h2/devices/bf16_gemm.hpp"
#include "h2/model/layers.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/silu.h>
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

at::Tensor token_embedding(const at::Tensor& wte, const at::Tensor& tokens) {
  H2_ENFORCE(tokens.defined() && tokens.dim() == 2,
             "embedding needs [B, T] tokens");
  return at::embedding(wte, tokens);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias, double eps) {
  return at::layer_norm(x, {x.size(-1)}, weight, bias, eps);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto wide = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  const auto y = wide * at::rsqrt(wide.square().mean(-1, true) + eps);
  return weight * y.to(x.scalar_type());
}

std::pair<at::Tensor, at::Tensor> rope_tables(std::int64_t t,
                                              std::int64_t head_dim,
                                              double theta,
                                              c10::Device device) {
  H2_ENFORCE(head_dim > 0 && head_dim % 2 == 0, "head_dim=", head_dim);
  // Hugging Face's LlamaRotaryEmbedding: inv_freq from integer exponents,
  // the angle table an outer product, both in fp32.
  const auto f32 = at::TensorOptions(at::kFloat);
  const auto exponents =
    at::arange(0, head_dim, 2, at::TensorOptions(at::kLong)).to(at::kFloat) /
    static_cast<double>(head_dim);
  const auto inv_freq = 1.0 / at::pow(theta, exponents);
  const auto positions = at::arange(t, f32);
  const auto freqs = at::outer(positions, inv_freq);
  const auto angles = at::cat({freqs, freqs}, -1);
  return {angles.cos().to(device), angles.sin().to(device)};
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos,
                const at::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  const auto rotated =
    at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  const auto t = x.size(-2);
  return x * cos.narrow(0, 0, t).to(x.scalar_type()) +
         rotated * sin.narrow(0, 0, t).to(x.scalar_type());
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
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
  const auto heads = q.size(1), kv_heads = k.size(1);
  H2_ENFORCE(kv_heads > 0 && heads % kv_heads == 0 && v.size(1) == kv_heads,
             "attention of ", heads, " query heads over ", kv_heads,
             " key/value heads");
  // Grouped-query attention: each key/value head serves heads / kv_heads
  // consecutive query heads.
  const auto keys =
    heads == kv_heads ? k : k.repeat_interleave(heads / kv_heads, 1);
  const auto values =
    heads == kv_heads ? v : v.repeat_interleave(heads / kv_heads, 1);
  auto scores = product(q, keys.transpose(-2, -1)) / std::sqrt(hd);
  scores = scores.masked_fill(mask, -INFINITY);
  return product(softmax(scores), values);
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
  // Under ZeRO-1 the chip's share of the flattened parameter: the same
  // element-wise arithmetic on fewer elements.
  at::Tensor value = p.value;
  if (p.shard_length >= 0) {
    value = p.value.view({-1}).narrow(0, p.shard_offset, p.shard_length);
    g = g.view({-1}).narrow(0, p.shard_offset, p.shard_length);
  }
  if (!p.exp_avg.defined()) { // empty for an empty share, like its peers'
    p.exp_avg = at::zeros_like(value);
    p.exp_avg_sq = at::zeros_like(value);
  }
  if (value.numel() == 0)
    return;
  if (grad_scale != 1.0)
    g.mul_(grad_scale);
  if (p.decay && train.weight_decay > 0)
    value.mul_(1.0 - lr * train.weight_decay);
  p.exp_avg.mul_(train.beta1).add_(g, 1.0 - train.beta1);
  p.exp_avg_sq.mul_(train.beta2).addcmul_(g, g, 1.0 - train.beta2);
  auto denom = (p.exp_avg_sq.sqrt() / bias2_sqrt).add_(train.eps);
  value.addcdiv_(p.exp_avg, denom, -step_size);
}

} // namespace h2::model::ops
