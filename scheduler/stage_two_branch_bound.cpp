// Stage 2's branch and bound over the stages' layer ranges in pipeline order
// (docs/planner.md, "Stage 2"): a node fixes the end layer of one more
// stage, the path bounds (stage_two_bounds.cpp) prune it, and a leaf is
// simulated. A node budget caps the work on very deep pipelines.
#include "stage_two_impl.hpp"

#include <algorithm>

namespace h2::scheduler::stage_two_detail {

bool group_search::branch_and_bound(group_solution& best, std::size_t budget,
                                    std::size_t& nodes) {
  incumbent_ = &best;
  node_budget_ = budget;
  nodes_used_ = &nodes;
  out_of_budget_ = false;
  assignment_ends_.assign(static_cast<std::size_t>(stages_), 0);
  // A leaf costs a simulation: charge it by its size.
  leaf_node_cost_ =
    std::max<std::size_t>(1, static_cast<std::size_t>(stages_) *
                               static_cast<std::size_t>(micro_batches_) / 16);
  branch(0, 0);
  return !out_of_budget_;
}

void group_search::branch(int s, int first) {
  if (out_of_budget_)
    return;
  const auto i = static_cast<std::size_t>(s);
  if (s == stages_ - 1) {
    if (++*nodes_used_ > node_budget_) {
      out_of_budget_ = true;
      return;
    }
    auto v = eval(s, first, layers_);
    if (!v.ok)
      return;
    bounds_.push(s, v);
    assignment_ends_[i] = layers_;
    if (bounds_.lower_bound(s, layers_) >= incumbent_->step)
      return;
    *nodes_used_ += leaf_node_cost_;
    auto sol = evaluate(assignment_ends_);
    if (sol.step < incumbent_->step)
      *incumbent_ = sol;
    return;
  }
  const int lo = first + 1;
  const int hi = max_end(s, first, lo, layers_ - (stages_ - 1 - s));
  if (hi < lo)
    return;
  // Closest to the incumbent's boundary first, then outwards.
  int guess = incumbent_->ends.empty()
                ? first + (layers_ - first) / (stages_ - s)
                : incumbent_->ends[i];
  guess = std::clamp(guess, lo, hi);
  for (int d = 0; guess - d >= lo || guess + d <= hi; ++d)
    for (int side = 0; side < (d == 0 ? 1 : 2); ++side) {
      const int end = side == 0 ? guess + d : guess - d;
      if (end < lo || end > hi)
        continue;
      if (++*nodes_used_ > node_budget_) {
        out_of_budget_ = true;
        return;
      }
      auto v = eval(s, first, end);
      bounds_.push(s, v);
      assignment_ends_[i] = end;
      if (bounds_.lower_bound(s, end) < incumbent_->step)
        branch(s + 1, end);
      if (out_of_budget_)
        return;
    }
}

} // namespace h2::scheduler::stage_two_detail
