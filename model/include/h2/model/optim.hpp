// AdamW, global gradient-norm clipping and the learning-rate schedule: what
// any trainer offers (Megatron-LM, torchtitan). Per-parameter math only, so a
// pipelined model updates exactly as the same model on one chip.
#pragma once

#include "h2/core/job.hpp"
#include "h2/model/layers.hpp"

#include <vector>

namespace h2::model {

/// Learning rate of `step` (0-based): linear warm-up to train.lr over
/// warmup_steps, then cosine decay to min_lr over decay_steps (default: the
/// remaining steps), then min_lr.
double learning_rate(const train_config& train, int step) noexcept;

/// Sum of squared gradient entries of one layer, accumulated in fp64
/// parameter by parameter (0 for parameters without a gradient). A tied
/// copy (parameter::tied) is left out: the embedding counts it once.
double squared_grad_norm(const layer& l);

/// The tied embedding's gradient (docs/job-file.md, tie_embeddings): the
/// embedding's and the head's copy's, summed as embedding + head (the same
/// bits on both chips). Returns `embedding_grad` + `head_grad`, either
/// undefined counting as zeros like `like`.
at::Tensor tied_gradient(const at::Tensor& embedding_grad,
                         const at::Tensor& head_grad, const at::Tensor& like);

/// The token table of an embedding layer and the tied copy of a head layer
/// (nullptr when `l` has none).
parameter* tied_weight(layer& l);

/// The global gradient norm from per-layer squared norms in global layer
/// order, summed in that order: every partition gets the same bits.
double global_grad_norm(const std::vector<double>& squared_norms_in_order);

/// The factor gradients are multiplied by: min(1, clip / (norm + 1e-6));
/// 1 when clipping is off (clip == 0).
double clip_coefficient(double grad_norm, double clip) noexcept;

/// One AdamW update of every parameter of `l` (PyTorch's AdamW semantics,
/// decoupled weight decay on `decay` parameters only). `step` is 1-based;
/// gradients are first multiplied by `grad_scale` (the clip coefficient).
/// Moments are allocated on first use: by make_moments() when every
/// parameter has a gradient, else one by one for those that have one (a
/// parameter without a gradient is left alone, as PyTorch's AdamW does).
void adamw_update(layer& l, const train_config& train, double lr, int step,
                  double grad_scale);

/// Gives `l` its AdamW moments: over `flat` when given (flat_moments()'s
/// order: each parameter's exp_avg then its exp_avg_sq, each of its
/// parameter's shape, or ZeRO-1's share's length), or zero where it has
/// none yet. They alias one buffer (`flat` itself, or one allocated on the
/// calling thread when no parameter has moments), so a moved layer sends
/// them without packing; parameters that have moments keep them, and the
/// others then get zero moments of their own.
void make_moments(layer& l, at::Tensor flat = at::Tensor());

} // namespace h2::model
