// Recomputation inside a stage (core/recompute.hpp, docs/planner.md
// "Recomputation"): a piece of the forward whose activations are not kept;
// its backward runs the piece again from its saved inputs and
// backpropagates through the rebuilt graph (a reentrant backward, as
// torch.utils.checkpoint's reentrant variant does). The forward runs again
// with the autocast and bf16-GEMM state it first ran with, so the rebuilt
// activations are bitwise the first ones and so are the gradients
// (tests/model/recompute_test.cpp, tests/actors/exactness_test.cpp).
// Parameters the piece reads get their gradients accumulated during that
// backward, so a split backward (model/split_backward.hpp) computes them in
// B rather than in W.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace h2::model {

/// `piece(inputs)` computed without keeping its activations: the result
/// carries a gradient function that recomputes it. Only `inputs` are kept.
/// Without grad mode this is `piece(inputs)`.
at::Tensor
recomputed(std::function<at::Tensor(const std::vector<at::Tensor>&)> piece,
           std::vector<at::Tensor> inputs);

} // namespace h2::model
