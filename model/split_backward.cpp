#include "h2/model/split_backward.hpp"

#include "h2/core/error.hpp"

#include <ATen/ops/ones_like.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_map>
#include <unordered_set>

namespace h2::model {

namespace ag = torch::autograd;

namespace {

/// Which nodes of the graph below `root` lead to `input`'s accumulator, and
/// which parameter accumulators each node leads to; memoised, so each node
/// is looked at once.
class graph_walk {
public:
  graph_walk(const ag::Node* input, std::unordered_set<const ag::Node*> params)
      : input_(input), params_(std::move(params)) {}

  bool reaches_input(ag::Node* n) {
    if (n == nullptr)
      return false;
    if (auto it = to_input_.find(n); it != to_input_.end())
      return it->second;
    bool out = n == input_;
    for (const auto& e : n->next_edges())
      out = reaches_input(e.function.get()) || out;
    to_input_[n] = out;
    return out;
  }

  /// The parameter accumulators below `n` (n itself included).
  void parameters_below(ag::Node* n, std::unordered_set<ag::Node*>& out) {
    if (n == nullptr || !seen_.insert(n).second)
      return;
    if (params_.count(n) != 0)
      out.insert(n);
    for (const auto& e : n->next_edges())
      parameters_below(e.function.get(), out);
  }

  void reset_seen() { seen_.clear(); }

private:
  const ag::Node* input_;
  std::unordered_set<const ag::Node*> params_;
  std::unordered_map<const ag::Node*, bool> to_input_;
  std::unordered_set<const ag::Node*> seen_;
};

} // namespace

/// A node that B ran and whose parameter branches W runs.
struct deferred_weight_gradients::state {
  struct root {
    ag::edge_list inputs;          ///< the node, at each of its inputs
    std::vector<at::Tensor> grads; ///< what B captured there
    ag::edge_list params;          ///< its parameters' accumulators
  };
  std::vector<root> roots;
  at::Tensor output; ///< keeps the graph alive until W
};

deferred_weight_gradients::deferred_weight_gradients() = default;
deferred_weight_gradients::~deferred_weight_gradients() = default;
deferred_weight_gradients::deferred_weight_gradients(
  deferred_weight_gradients&&) noexcept = default;
deferred_weight_gradients& deferred_weight_gradients::operator=(
  deferred_weight_gradients&&) noexcept = default;

bool deferred_weight_gradients::pending() const noexcept {
  return state_ != nullptr;
}

std::pair<at::Tensor, deferred_weight_gradients>
deferred_weight_gradients::backward_input(
  const at::Tensor& output, const at::Tensor& grad, const at::Tensor& input,
  const std::vector<at::Tensor>& parameters) {
  const at::Tensor seed =
    grad.defined() ? grad : at::ones_like(output, at::MemoryFormat::Contiguous);
  const ag::Edge root = ag::impl::gradient_edge(output);
  H2_ENFORCE(root.function != nullptr, "the output has no autograd graph");
  std::unordered_set<const ag::Node*> params;
  ag::edge_list all_params;
  for (const auto& p : parameters) {
    all_params.push_back(ag::impl::gradient_edge(p));
    params.insert(all_params.back().function.get());
  }
  deferred_weight_gradients out;
  out.state_ = std::make_unique<state>();
  out.state_->output = output;
  if (!input.defined()) {
    // Nothing to differentiate for the previous chunk: W is the whole
    // backward.
    out.state_->roots.push_back({{root}, {seed}, all_params});
    return {at::Tensor(), std::move(out)};
  }
  const ag::Edge input_edge = ag::impl::gradient_edge(input);
  graph_walk walk(input_edge.function.get(), params);
  // The nodes on the path to the input, in the graph below the output, and
  // the branches they feed that lead to parameters only.
  std::vector<ag::Node*> stack{root.function.get()};
  std::unordered_set<ag::Node*> visited{root.function.get()};
  ag::edge_list captures{input_edge};
  while (!stack.empty()) {
    ag::Node* n = stack.back();
    stack.pop_back();
    if (!walk.reaches_input(n))
      continue;
    std::unordered_set<ag::Node*> below;
    walk.reset_seen();
    for (const auto& e : n->next_edges()) {
      ag::Node* child = e.function.get();
      if (child == nullptr)
        continue;
      if (walk.reaches_input(child)) {
        if (visited.insert(child).second)
          stack.push_back(child);
      } else {
        walk.parameters_below(child, below);
      }
    }
    if (below.empty())
      continue;
    state::root r;
    for (uint32_t i = 0; i < n->num_inputs(); ++i) {
      r.inputs.emplace_back(n->shared_from_this(), i);
      captures.push_back(r.inputs.back());
    }
    for (ag::Node* p : below)
      r.params.emplace_back(p->shared_from_this(), 0);
    out.state_->roots.push_back(std::move(r));
  }
  // B: the input's gradient and, at every root, the gradient flowing in;
  // nodes compute only the outputs on the way to the input.
  auto grads = ag::Engine::get_default_engine().execute(
    {root}, {seed}, /*keep_graph=*/true, /*create_graph=*/false,
    /*accumulate_grad=*/false, captures);
  std::size_t next = 1;
  for (auto& r : out.state_->roots)
    for (std::size_t i = 0; i < r.inputs.size(); ++i)
      r.grads.push_back(grads[next++]);
  return {grads[0], std::move(out)};
}

void deferred_weight_gradients::run() {
  H2_ENFORCE(state_ != nullptr, "W ran twice");
  auto& engine = ag::Engine::get_default_engine();
  for (auto& r : state_->roots) {
    bool any = false;
    for (const auto& g : r.grads)
      any = any || g.defined();
    if (!any)
      continue; // no gradient reached this node (an unused branch)
    // Restricted to this node's own parameters: its path to the input is
    // not run again, and other nodes' parameters are theirs.
    engine.execute(r.inputs, r.grads, /*keep_graph=*/true,
                   /*create_graph=*/false, /*accumulate_grad=*/true, r.params);
  }
  state_.reset(); // the graph and the captured gradients go
}

} // namespace h2::model
