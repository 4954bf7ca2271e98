// A chunk's backward in two halves (docs/planner.md, "Split backward"), as
// zero-bubble schedules run it: B computes the gradients of the chunk's
// input, which the previous chunk waits for; W later computes the weight
// gradients, which nobody waits for.
//
// How. B runs the autograd engine from the chunk's output to its input
// only; wherever a node on that path also feeds parameters (a matrix
// product's weight, a LayerNorm's scale), it captures the gradient flowing
// into that node. W runs each such node again from its captured gradient,
// restricted to the paths to its own parameters, so it computes only the
// weight gradients (the weight GEMM, not the input GEMM) and nothing twice.
// Every parameter gradient comes from the same node with the same incoming
// gradient as in the fused backward, so fp32 results are bitwise equal
// (tests/model/split_backward_test.cpp, tests/actors/exactness_test.cpp).
// What W keeps alive between the two: the chunk's autograd graph (its saved
// activations) and the captured gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace h2::model {

/// The W half of one micro-batch's backward through one chunk.
class deferred_weight_gradients {
public:
  deferred_weight_gradients();
  ~deferred_weight_gradients();
  deferred_weight_gradients(deferred_weight_gradients&&) noexcept;
  deferred_weight_gradients& operator=(deferred_weight_gradients&&) noexcept;

  /// B: the gradient of `input` (undefined when `input` is: the first
  /// chunk, whose whole backward is then W) from `output` and its gradient
  /// `grad` (undefined for a scalar loss: 1). The weight gradients of
  /// `parameters` are left for run(). `output` stays referenced until
  /// run().
  static std::pair<at::Tensor, deferred_weight_gradients>
  backward_input(const at::Tensor& output, const at::Tensor& grad,
                 const at::Tensor& input,
                 const std::vector<at::Tensor>& parameters);

  /// W: accumulates the deferred gradients into the parameters' .grad and
  /// releases the graph. Call once.
  void run();

  /// False once run() ran (or for a default-constructed one).
  bool pending() const noexcept;

private:
  struct state;
  std::unique_ptr<state> state_;
};

} // namespace h2::model
