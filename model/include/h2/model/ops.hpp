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

#include <cstdint>
#include <utility>

namespace h2::model {

struct parameter;

namespace ops {

/// Token plus position embedding: wte[tokens] + wpe[0, T); tokens [B, T]
/// int64 -> [B, T, d].
at::Tensor embedding(const at::Tensor& wte, const at::Tensor& wpe,
                     const at::Tensor& tokens);

/// Token embedding alone (llama: positions are rotary): wte[tokens];
/// tokens [B, T] int64 -> [B, T, d].
at::Tensor token_embedding(const at::Tensor& wte, const at::Tensor& tokens);

/// LayerNorm over the last dimension with gain `weight` and bias `bias`.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight,
                      const at::Tensor& bias, double eps);

/// RMSNorm over the last dimension as Hugging Face's LlamaRMSNorm computes
/// it: x / sqrt(mean(x^2) + eps) in fp32 (fp64 stays fp64), cast back to
/// x's dtype, times `weight`.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

/// The rotary embedding's cos and sin tables for positions [0, t) of a
/// head of width `head_dim` (even), each [t, head_dim] fp32 on `device`:
/// frequency i = theta^(-2i / head_dim), repeated for both halves (the
/// rotate-half layout of Hugging Face's Llama, docs/export.md).
std::pair<at::Tensor, at::Tensor> rope_tables(std::int64_t t,
                                              std::int64_t head_dim,
                                              double theta, c10::Device device);

/// Rotates `x` [B, H, T, hd] by position: x cos + rotate_half(x) sin, where
/// rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2]); the tables (from
/// rope_tables) are cast to x's dtype.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos,
                const at::Tensor& sin);

/// SwiGLU's gate: silu(gate) * up.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

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

/// Causal scaled dot-product attention: q [B, H, T, hd], k and v
/// [B, Hkv, T, hd] -> [B, H, T, hd]; `mask` is causal_mask(T, ...). With
/// Hkv < H (grouped-query attention) query head i reads key/value head
/// i / (H / Hkv), as Hugging Face's repeat_kv arranges them.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& mask);

/// The summed token cross-entropy of `logits` [N, vocab] against
/// `targets` [N], computed in fp32 whatever the logits' lower dtype (fp64
/// logits stay fp64).
at::Tensor cross_entropy_sum(const at::Tensor& logits,
                             const at::Tensor& targets);

/// One AdamW update of `p` (PyTorch's AdamW: decoupled weight decay when
/// p.decay), `step` 1-based, the gradient first multiplied by `grad_scale`.
/// Moments are allocated on first use, beside the weight. A sharded
/// parameter (parameter::shard_length, ZeRO-1) updates only its share, with
/// moments of that share (empty ones for an empty share).
void adamw(parameter& p, const train_config& train, double lr, int step,
           double grad_scale);

} // namespace ops
} // namespace h2::model
