// Private to runtime/: the state of one step's op list, shared by
// stage_worker.cpp (receives, reductions) and stage_worker_step.cpp (the op
// loop), and the error guard both run their work under.
#pragma once

#include "h2/core/error.hpp"
#include "h2/model/split_backward.hpp"
#include "h2/runtime/stage_worker.hpp"

#include <c10/util/Exception.h>

#include <map>
#include <vector>

namespace h2::runtime {

/// What each micro-batch of each chunk holds between its ops, and what the
/// step has measured so far. Indexed by slot(): the chip's chunks one after
/// the other, micro-batches within.
struct stage_worker::op_context {
  op_context(std::size_t chunks, int micro_batches)
      : micro_batches(static_cast<std::size_t>(micro_batches)),
        input(chunks * this->micro_batches),
        output(input.size()),
        weight_work(input.size()),
        grad(input.size()),
        input_grad(input.size()),
        batch(input.size()) {}

  /// The slot of micro-batch `mb` of the chip's chunk `local`.
  std::size_t slot(std::size_t local, int mb) const noexcept {
    return local * micro_batches + static_cast<std::size_t>(mb);
  }

  std::size_t micro_batches;
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

// Defined here, not in stage_worker.cpp: stage_worker_step.cpp uses it too,
// and each file compiles alone (H2_UNITY=OFF).
template <class F>
auto stage_worker::guarded(F&& f) -> decltype(f()) {
  const auto failures_before = device_->memory().failures();
  try {
    return f();
  } catch (const device_error&) {
    close_channels();
    throw;
  } catch (const h2::error&) {
    close_channels();
    throw;
  } catch (const c10::Error& e) {
    close_channels();
    std::rethrow_exception(device_->translate(e, failures_before));
  } catch (...) {
    close_channels();
    throw;
  }
}

} // namespace h2::runtime
