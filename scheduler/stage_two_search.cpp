// Stage 2, one group of identical replicas (docs/planner.md, "Stage 2"):
// the stages' costs at a micro-batch size, the simulated step of an
// assignment of layers, and the search over micro-batch sizes.
#include "stage_two_impl.hpp"

#include <algorithm>
#include <cmath>

namespace h2::scheduler::stage_two_detail {

group_search::group_search(planner::impl& impl, const replica_group& g,
                           bool reduce_across_replicas, int plan_replicas)
    : planner_(impl),
      chips_(g.replicas.size()),
      stages_(static_cast<int>(g.replicas.front().size())),
      replicas_(static_cast<int>(g.replicas.size())),
      layers_(impl.layers()),
      blocks_(impl.job->model.n_layer),
      reduce_across_replicas_(reduce_across_replicas && g.replicas.size() > 1),
      // Several groups (reduced across groups) mean several replicas.
      reduced_(!reduce_across_replicas || g.replicas.size() > 1),
      zero1_replicas_(impl.job->plan.zero1 ? plan_replicas : 1) {
  for (std::size_t r = 0; r < g.replicas.size(); ++r)
    for (int c : g.replicas[r])
      chips_[r].push_back(impl.chips[static_cast<std::size_t>(c)]);
}

void group_search::setup(int micro_batch_size, int sequences) {
  micro_batch_size_ = micro_batch_size;
  micro_batches_ = sequences / micro_batch_size;
  const auto stage_count = static_cast<std::size_t>(stages_);
  coefficients_.assign(stage_count, nullptr);
  capacity_bytes_.assign(stage_count, inf);
  in_flight_.assign(stage_count, 0);
  for (int s = 0; s < stages_; ++s) {
    const auto i = static_cast<std::size_t>(s);
    coefficients_[i] =
      &planner_.costs.coefficients(*chips_[0][i], micro_batch_size);
    for (const auto& replica : chips_)
      capacity_bytes_[i] = std::min(capacity_bytes_[i],
                                    planner_.costs.capacity_bytes(*replica[i]));
    in_flight_[i] =
      in_flight_bound(planner_.pipeline_schedule, stages_, s, micro_batches_);
  }
  // Link patterns: replicas whose links are alike simulate alike.
  link_patterns_.clear();
  for (const auto& replica : chips_) {
    std::vector<double> activation(stage_count, 0.0),
      gradient(stage_count, 0.0);
    for (std::size_t s = 0; s < stage_count; ++s) {
      if (s > 0)
        activation[s] = planner_.costs.boundary_seconds(
          *replica[s - 1], *replica[s], micro_batch_size);
      if (s + 1 < stage_count)
        gradient[s] = planner_.costs.boundary_seconds(
          *replica[s + 1], *replica[s], micro_batch_size);
    }
    auto pattern = std::make_pair(activation, gradient);
    if (std::find(link_patterns_.begin(), link_patterns_.end(), pattern) ==
        link_patterns_.end())
      link_patterns_.push_back(std::move(pattern));
  }
  // The ring of every stage position across the replicas, and the
  // all-reduce of each layer count there (memoised: it depends on the
  // stage's layers, not on the micro-batch size).
  if (reduction_rings_.empty()) {
    reduction_rings_.assign(stage_count, {});
    allreduce_seconds_memo_.assign(
      stage_count,
      std::vector<double>(4 * static_cast<std::size_t>(blocks_ + 1), -1.0));
    if (reduce_across_replicas_)
      for (std::size_t s = 0; s < stage_count; ++s) {
        std::vector<const chip_spec*> ring;
        for (int r = 0; r < replicas_; ++r)
          ring.push_back(chips_[static_cast<std::size_t>(r)][s]);
        reduction_rings_[s] = planner_.costs.ring_links(ring);
      }
  }
  bounds_ = path_bounds(bound_inputs_of());
}

stage_value group_search::eval(int s, const stage_layers& layers) const {
  const auto i = static_cast<std::size_t>(s);
  stage_value v;
  const auto fit = coefficients_[i]->fitting(
    layers, in_flight_[i], capacity_bytes_[i], planner_.options.recompute,
    reduced_, zero1_replicas_);
  if (!fit)
    return v;
  const stage_cost& c = *fit;
  v.ok = true;
  v.recompute = c.recompute;
  v.forward = c.forward_seconds;
  v.backward = c.backward_seconds;
  v.input = c.input_seconds;
  v.weight = c.weight_seconds;
  v.optimizer = c.optimizer_seconds;
  v.allreduce = allreduce_seconds(s, layers);
  v.gradient_bytes = c.gradient_bytes;
  return v;
}

stage_value group_search::eval(int s, int first, int end) const {
  return eval(s, stage_layers::of(planner_.job->model, first, end));
}

stage_layers group_search::layers_with(int s, int blocks) const {
  stage_layers l;
  l.embedding = s == 0;
  l.head = s == stages_ - 1;
  l.blocks = blocks;
  return l;
}

group_solution group_search::evaluate(const std::vector<int>& ends) {
  const auto stage_count = static_cast<std::size_t>(stages_);
  forward_seconds_.resize(stage_count);
  backward_seconds_.resize(stage_count);
  input_seconds_.resize(stage_count);
  weight_seconds_.resize(stage_count);
  stage_allreduce_seconds_.resize(stage_count);
  double optimizer = 0, first_bytes = 0;
  int first = 0;
  for (std::size_t s = 0; s < stage_count; ++s) {
    auto v = eval(static_cast<int>(s), first, ends[s]);
    if (!v.ok)
      return {};
    forward_seconds_[s] = v.forward;
    backward_seconds_[s] = v.backward;
    input_seconds_[s] = v.input;
    weight_seconds_[s] = v.weight;
    stage_allreduce_seconds_[s] = v.allreduce;
    optimizer = std::max(optimizer, v.optimizer);
    first = ends[s];
    if (s == 0)
      first_bytes = v.gradient_bytes;
  }
  // As simulate(): each stage position's all-reduce starts when that
  // position is done in every replica; then the norm, then the updates.
  stage_end_seconds_.assign(stage_count, 0.0);
  double makespan = 0;
  for (const auto& [activation, gradient] : link_patterns_) {
    makespan =
      std::max(makespan, planner_.pipeline_simulator.makespan(
                           planner_.pipeline_schedule, stages_, micro_batches_,
                           forward_seconds_.data(), backward_seconds_.data(),
                           input_seconds_.data(), weight_seconds_.data(),
                           activation.data(), gradient.data()));
    const auto& stage_ends = planner_.pipeline_simulator.stage_ends();
    for (std::size_t s = 0; s < stage_count; ++s)
      stage_end_seconds_[s] = std::max(stage_end_seconds_[s], stage_ends[s]);
  }
  double phase = 0;
  for (std::size_t s = 0; s < stage_count; ++s)
    phase =
      std::max(phase, reduce_across_replicas_
                        ? stage_end_seconds_[s] + stage_allreduce_seconds_[s]
                        : stage_end_seconds_[s]);
  group_solution out;
  out.phase = reduce_across_replicas_ ? phase : makespan;
  out.optimizer = optimizer;
  out.first_gradient_bytes = first_bytes;
  out.step = out.phase + optimizer;
  out.micro_batch_size = micro_batch_size_;
  out.ends = ends;
  return out;
}

void group_search::enumerate(
  const std::function<void(const std::vector<int>&)>& f) {
  assignment_ends_.assign(static_cast<std::size_t>(stages_), 0);
  enumerate_from(0, 0, f);
}

void group_search::enumerate_from(
  int s, int first, const std::function<void(const std::vector<int>&)>& f) {
  const auto i = static_cast<std::size_t>(s);
  if (s == stages_ - 1) {
    if (eval(s, first, layers_).ok) {
      assignment_ends_[i] = layers_;
      f(assignment_ends_);
    }
    return;
  }
  const int lo = first + 1;
  const int hi = max_end(s, first, lo, layers_ - (stages_ - 1 - s));
  for (int end = lo; end <= hi; ++end) {
    assignment_ends_[i] = end;
    enumerate_from(s + 1, end, f);
  }
}

std::vector<recompute_policy>
group_search::recompute_of(const std::vector<int>& ends) const {
  std::vector<recompute_policy> out;
  int first = 0;
  for (int s = 0; s < stages_; ++s) {
    out.push_back(eval(s, first, ends[static_cast<std::size_t>(s)]).recompute);
    first = ends[static_cast<std::size_t>(s)];
  }
  return out;
}

double group_search::allreduce_seconds(int s,
                                       const stage_layers& layers) const {
  const auto& ring = reduction_rings_[static_cast<std::size_t>(s)];
  if (ring.size() < 2)
    return 0;
  double& memo =
    allreduce_seconds_memo_[static_cast<std::size_t>(s)]
                           [4 * static_cast<std::size_t>(layers.blocks) +
                            (layers.embedding ? 2 : 0) + (layers.head ? 1 : 0)];
  if (memo < 0)
    memo = planner_.costs.allreduce_seconds(
      ring, planner_.costs.buckets(layers), zero1_replicas_ > 1);
  return memo;
}

std::vector<int> group_search::ends_of(const std::vector<int>& blocks) const {
  std::vector<int> ends;
  int at = 0;
  for (int s = 0; s < stages_; ++s) {
    at += blocks[static_cast<std::size_t>(s)] + (s == 0 ? 1 : 0) +
          (s == stages_ - 1 ? 1 : 0);
    ends.push_back(at);
  }
  return ends;
}

/// The largest end for the stage at `s` starting at `first` that fits,
/// within [lo, hi]; lo - 1 when none does (memory grows with layers).
int group_search::max_end(int s, int first, int lo, int hi) const {
  if (!eval(s, first, lo).ok)
    return lo - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (eval(s, first, mid).ok)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

void add_replicas(planner::impl& impl, const replica_group& g,
                  group_search& search, const group_solution& sol,
                  int sequences_per_replica, plan& p) {
  search.setup(sol.micro_batch_size, sequences_per_replica);
  auto recompute = search.recompute_of(sol.ends);
  for (const auto& chips : g.replicas) {
    replica_plan r;
    r.micro_batch_size = sol.micro_batch_size;
    r.micro_batches = sequences_per_replica / sol.micro_batch_size;
    int first = 0;
    for (std::size_t s = 0; s < chips.size(); ++s) {
      stage_plan stage;
      stage.chip = impl.chips[static_cast<std::size_t>(chips[s])]->id;
      stage.first_layer = first;
      stage.end_layer = sol.ends[s];
      stage.recompute = recompute[s];
      first = sol.ends[s];
      r.stages.push_back(stage);
    }
    p.replicas.push_back(std::move(r));
  }
}

double binomial(int n, int k) {
  double r = 1;
  for (int i = 1; i <= k; ++i)
    r = r * (n - k + i) / i;
  return r;
}

group_solution solve_group(planner::impl& impl, group_search& search,
                           int sequences, double bound, bool& proven,
                           std::size_t& nodes) {
  group_solution best;
  best.step = bound;
  // Branch and bound proves optimality where the space of partitions is
  // within reach; beyond it, a small budget only polishes the heuristic.
  const auto sizes = impl.micro_batch_sizes(sequences);
  const double space = binomial(impl.layers() - 1, search.stages() - 1) *
                       static_cast<double>(sizes.size());
  const std::size_t budget =
    space <= 1e9 ? impl.options.search_nodes
                 : std::min<std::size_t>(impl.options.search_nodes, 2000);
  for (int micro_batch_size : sizes) {
    search.setup(micro_batch_size, sequences);
    auto start = search.heuristic();
    if (start.step < best.step)
      best = start;
    std::size_t used = 0;
    bool complete = search.branch_and_bound(best, budget, used);
    nodes += used;
    proven = proven && complete;
  }
  if (best.ends.empty())
    best.step = inf;
  return best;
}

stage_two_result solve_one_group(planner::impl& impl, const replica_group& g,
                                 double bound) {
  stage_two_result out;
  out.proven_optimal = true;
  const int batch = impl.sequences();
  const int replica_count = static_cast<int>(g.replicas.size());
  if (batch % replica_count != 0)
    return out;
  group_search search(impl, g, true, static_cast<int>(g.replicas.size()));
  bool proven = true;
  auto best =
    solve_group(impl, search, batch / replica_count, bound, proven, out.nodes);
  out.proven_optimal = proven;
  if (!std::isfinite(best.step))
    return out;
  out.feasible = true;
  out.step_seconds = best.step;
  out.value.schedule = impl.pipeline_schedule;
  out.value.zero1 = impl.job->plan.zero1 && g.replicas.size() > 1;
  add_replicas(impl, g, search, best, batch / replica_count, out.value);
  return out;
}

} // namespace h2::scheduler::stage_two_detail
