// The operators the GPT is made of, one function each. The layers
// (layers.cpp) and the optimizer (optim.cpp) compute with these and nothing
// else, so h2-opcheck (opcheck.hpp) checks exactly the math that trains
// (docs/ditorch.md).
//
// Every function runs on its inputs' device, in their dtype or the one
// autocast picks (devices::compute_scope); on host chips whose bf16 GEMMs
// run with fp32 kernels, linear and attention's products go through
// devices/bf16_gemm.hpp.
#pragma once

#include "h2/core/job.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace h2::model {

struct parameter;

namespace ops {

/// Token plus position embedding: wte[tokens] + wpe[0, T); tokens [B, T]
/// int64 -> [B, T, d].
at::Tensor embedding(const at::Tensor& wte, const at::Tensor& wpe,
                     const at::Tensor& tokens);

/// LayerNorm over the last dimension with gain `weight` and bias `bias`
/// (eps: layer_norm_eps).
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias);

/// x W^T + b (`bias` may be undefined: no bias).
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias);

/// GELU (erf form, PyTorch's default).
at::Tensor gelu(const at::Tensor& x);

/// Softmax over the last dimension, in `x`'s dtype.
at::Tensor softmax(const at::Tensor& x);

/// True above the diagonal of a [t, t] matrix on `device`: the positions a
/// token must not attend to.
at::Tensor causal_mask(std::int64_t t, c10::Device device);

/// Causal scaled dot-product attention: q, k, v [B, H, T, hd] ->
/// [B, H, T, hd]; `mask` is causal_mask(T, ...).
at::Tensor attention(const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& mask);

/// The summed token cross-entropy of `logits` [N, vocab] against
/// `targets` [N], computed in fp32 whatever the logits' lower dtype (fp64
/// logits stay fp64).
at::Tensor cross_entropy_sum(const at::Tensor& logits,
                             const at::Tensor& targets);

/// One AdamW update of `p` (PyTorch's AdamW: decoupled weight decay when
/// p.decay), `step` 1-based, the gradient first multiplied by `grad_scale`.
/// Moments are allocated on first use, beside the weight.
void adamw(parameter& p, const train_config& train, double lr, int step,
           double grad_scale);

} // namespace ops
} // namespace h2::model
