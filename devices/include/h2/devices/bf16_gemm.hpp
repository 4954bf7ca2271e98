// bf16 GEMMs computed with fp32 kernels (docs/emulation.md, "bf16 on the
// host CPU"): the operands are rounded to bf16, multiplied and accumulated
// in fp32, and the result is rounded to bf16 -- what a bf16 GEMM computes on
// a GPU, at the speed of the host's fp32 kernels. Backward does the same for
// each gradient GEMM. What autograd saves for backward is the bf16 operands,
// as under autocast, so a chip's memory is what its bf16 kernels would use.
//
// compute_scope turns the path on for its thread when its chip is a bf16
// chip on the host CPU whose cpu_bf16 path is fp32_accumulate; the GPT's
// operators (model/ops.hpp) ask active() and call linear() and matmul()
// here instead of libtorch's autocast kernels.
#pragma once

#include <ATen/core/Tensor.h>

namespace h2::devices::bf16_gemm {

/// Whether the calling thread computes bf16 GEMMs here (a compute_scope of
/// such a chip is open on it).
bool active() noexcept;

/// Sets active() for the calling thread; returns what it was.
bool set_active(bool on) noexcept;

/// x W^T + b as a bf16 GEMM: x [..., in], weight [out, in], bias [out] or
/// undefined. Returns bf16; gradients come back in each input's dtype.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias);

/// a @ b as a bf16 GEMM for a [..., m, k] and b [..., k, n] with at least
/// two dimensions each (batch dimensions broadcast as at::matmul's do).
/// Returns bf16; gradients come back in each input's dtype.
at::Tensor matmul(const at::Tensor& a, const at::Tensor& b);

} // namespace h2::devices::bf16_gemm
