// Private to runtime/: the state of one step's op list, shared by
// stage_worker.cpp (receives, reductions) and stage_worker_step.cpp (the op
// loop).
#pragma once

#include "h2/model/split_backward.hpp"
#include "h2/runtime/stage_worker.hpp"

#include <map>
#include <vector>

namespace h2::runtime {

/// What each micro-batch holds between its ops, and what the step has
/// measured so far. Indexed by micro-batch (a worker runs one chunk).
struct stage_worker::op_context {
  explicit op_context(int micro_batches)
      : input(micro_batches),
        output(micro_batches),
        weight_work(micro_batches),
        grad(micro_batches),
        input_grad(micro_batches),
        batch(micro_batches) {}

  std::vector<at::Tensor> input;  ///< received activations (leaves)
  std::vector<at::Tensor> output; ///< chunk outputs kept for the backward
  /// A split backward's W, from its B (which keeps the graph for it).
  std::vector<model::deferred_weight_gradients> weight_work;
  std::vector<at::Tensor> grad;       ///< received output gradients
  std::vector<at::Tensor> input_grad; ///< gradients to send back
  std::vector<model::micro_batch> batch;
  double idle_seconds = 0;
  std::vector<op_record> ops;
  std::map<chip_id, link_charge> links; ///< pipeline receives, per sender
  /// Charged (virtual) seconds of the step's forward and backward ops (B
  /// and W count as backward).
  double forward_charged = 0, backward_charged = 0;
};

} // namespace h2::runtime
