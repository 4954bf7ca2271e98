#include "h2/model/recompute.hpp"

#include "h2/core/error.hpp"
#include "h2/devices/bf16_gemm.hpp"
#include "h2/devices/torch_compat.hpp"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

namespace h2::model {

namespace ag = torch::autograd;

namespace {

/// The thread's compute state a forward ran under (devices::compute_scope
/// sets it): autocast of the inputs' device type and the bf16-GEMM path.
struct compute_state {
  c10::DeviceType type = c10::kCPU;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
  bool bf16_gemm = false;

  static compute_state current(c10::DeviceType type) {
    return {type, devices::compat::autocast_enabled(type),
            devices::compat::autocast_dtype(type),
            devices::bf16_gemm::active()};
  }
};

/// Puts `state` in place for its lifetime and restores what was there (the
/// autocast cache of casts made meanwhile is dropped at the outermost
/// level, as compute_scope drops it).
class state_scope {
public:
  explicit state_scope(const compute_state& state)
      : previous_(compute_state::current(state.type)) {
    at::autocast::increment_nesting();
    devices::compat::set_autocast(state.type, state.autocast,
                                  state.autocast_dtype);
    devices::bf16_gemm::set_active(state.bf16_gemm);
  }
  ~state_scope() {
    devices::bf16_gemm::set_active(previous_.bf16_gemm);
    devices::compat::set_autocast(previous_.type, previous_.autocast,
                                  previous_.autocast_dtype);
    if (at::autocast::decrement_nesting() == 0)
      at::autocast::clear_cache();
  }
  state_scope(const state_scope&) = delete;
  state_scope& operator=(const state_scope&) = delete;

private:
  compute_state previous_;
};

/// Turns autocast's cache of cast weights off for its lifetime: the casts
/// are the same, they are only not kept.
class uncached_casts {
public:
  uncached_casts() : previous_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~uncached_casts() { at::autocast::set_autocast_cache_enabled(previous_); }
  uncached_casts(const uncached_casts&) = delete;
  uncached_casts& operator=(const uncached_casts&) = delete;

private:
  bool previous_;
};

using piece_function =
  std::function<at::Tensor(const std::vector<at::Tensor>&)>;

/// The gradient function of a recomputed piece.
class recompute_node final : public ag::Node {
public:
  recompute_node(piece_function piece, std::vector<at::Tensor> inputs,
                 compute_state state)
      : piece_(std::move(piece)), inputs_(std::move(inputs)), state_(state) {}

  std::string name() const override { return "h2::RecomputeBackward"; }

  ag::variable_list apply(ag::variable_list&& grads) override {
    H2_ENFORCE(!inputs_.empty(), "a recomputed piece's backward ran twice");
    std::vector<at::Tensor> leaves;
    for (std::size_t i = 0; i < inputs_.size(); ++i)
      leaves.push_back(
        inputs_[i].detach().requires_grad_(should_compute_output(i)));
    at::Tensor output;
    {
      at::AutoGradMode grad(true);
      state_scope scope(state_);
      output = piece_(leaves);
    }
    inputs_.clear(); // what the piece kept is released with its graph
    ag::backward({output}, {grads.at(0)});
    ag::variable_list out;
    for (auto& x : leaves)
      out.push_back(x.requires_grad() ? x.grad() : at::Tensor());
    return out;
  }

  void release_variables() override { inputs_.clear(); }

private:
  piece_function piece_;
  std::vector<at::Tensor> inputs_; ///< detached: they keep no graph alive
  compute_state state_;
};

} // namespace

at::Tensor recomputed(piece_function piece, std::vector<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled())
    return piece(inputs);
  H2_ENFORCE(!inputs.empty(), "a recomputed piece needs an input");
  at::Tensor output;
  {
    at::NoGradGuard no_grad;
    // Autocast would keep the piece's casts of its weights (bf16 copies)
    // until the stage's forward ends, though the piece keeps nothing and its
    // backward casts again.
    uncached_casts uncached;
    output = piece(inputs);
  }
  std::vector<at::Tensor> kept;
  for (const auto& x : inputs)
    kept.push_back(x.detach());
  auto node = std::shared_ptr<recompute_node>(
    new recompute_node(std::move(piece), std::move(kept),
                       compute_state::current(inputs.front().device().type())),
    ag::deleteNode);
  node->set_next_edges(ag::collect_next_edges(inputs));
  ag::set_history(output, node);
  return output;
}

} // namespace h2::model
