// Private to scheduler/: what the sources of stage 2 share (docs/planner.md,
// "Stage 2: layers, micro-batching, recomputation").
//
// - stage_two.cpp: the entry, one group or several;
// - stage_two_search.cpp: group_search, a group's stages, their costs and
//   the simulated step of an assignment; solve_group();
// - stage_two_bounds.cpp: lower bounds, from paths of the precedence graph,
//   the continuous relaxation and the all-reduce of an option;
// - stage_two_branch_bound.cpp: branch and bound over the layer ranges;
// - stage_two_heuristic.cpp: the bottleneck-balancing heuristic and its
//   local search;
// - stage_two_groups.cpp: several groups, the split of the batch.
//
// The tests call the bounds directly
// (tests/scheduler/stage_two_bounds_test.cpp).
#pragma once

#include "planner_impl.hpp"

#include <cstddef>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

namespace h2::scheduler::stage_two_detail {

inline constexpr double inf = std::numeric_limits<double>::infinity();

/// A stage's costs as the search needs them, seconds per micro-batch
/// (optimizer and all-reduce: per step).
struct stage_value {
  bool ok = false;        ///< the stage fits in its chips' memory
  /// The cheapest recomputation with which it fits
  /// (stage_coefficients::fitting).
  recompute_policy recompute;
  double forward = 0, backward = 0, optimizer = 0, allreduce = 0;
  double input = 0, weight = 0; ///< B and W (split backward)
  double gradient_bytes = 0; ///< fp32 gradients of the stage
};

/// The best assignment found for one group.
struct group_solution {
  double step = inf;    ///< phase + max optimizer (seconds)
  double phase = inf;   ///< the pipeline phase, all-reduces included (seconds)
  double optimizer = 0; ///< the slowest stage's update (seconds)
  double first_gradient_bytes = 0; ///< of the first stage
  int micro_batch_size = 0;
  std::vector<int> ends; ///< end layer of every stage
};

// ---------------------------------------------------------------------------
// Bounds (stage_two_bounds.cpp)

/// The continuous relaxation of "the largest alpha_s + beta_s k_s over stages
/// s = from..p-1 holding k_s blocks between them", as suffix sums over the
/// stages (index s: stages s..p-1; index p: none).
struct relaxation {
  std::vector<double> sum_inverse_slope;        ///< sum of 1 / beta_s
  std::vector<double> sum_intercept_over_slope; ///< sum of alpha_s / beta_s
  std::vector<double> max_floor; ///< largest alpha_s + beta_s x (fewest blocks)
  std::vector<double> flat_stages; ///< stages with beta_s = 0
};

/// A lower bound of the min over distributions of `blocks` blocks over stages
/// from..p-1 (each at least its fewest) of the largest alpha_s + beta_s k_s.
double relaxed_bound(const relaxation& r, std::size_t from, int blocks);

/// What the path bounds of one group know at one micro-batch size. Seconds
/// per micro-batch.
struct bound_inputs {
  schedule_kind schedule = schedule_kind::one_f_one_b;
  int micro_batches = 1;
  int layers = 0; ///< pipeline layers: embedding, blocks, head
  /// Per stage: one transformer block on that stage's chip.
  std::vector<layer_timing> block;
  layer_timing head; ///< the head on the last stage's chip
  /// Per stage: the fastest link (over the replicas) into stage s from s - 1
  /// (activations; 0 at stage 0) and from s + 1 (gradients; 0 at the last).
  std::vector<double> min_activation_link_seconds, min_gradient_link_seconds;
  /// The update of the last stage holding only the head (0 when it does not
  /// fit): every step updates at least that.
  double last_stage_min_optimizer_seconds = 0;
};

/// Per assigned stage s: running sums and maxima over stages 0..s (seconds).
struct path_state {
  double compute = 0; ///< sum of F + B
  double forward = 0; ///< sum of F
  /// Largest "stages 0..j-1 forward once, then all m micro-batches of stage
  /// j" path: the bound of schedules that split the backward, whose W need
  /// not wait for anything after them.
  double max_own_path = 0;
  /// Longest "stage 0..j-1 once, then all m micro-batches of stage j" path.
  double max_fill_path = 0;
  /// Largest (m - 1 - w) F + (m - 1) B, w = min(p - 1 - s, m - 1): the 1F1B
  /// steady state of a stage.
  double max_one_f_one_b = 0;
  double max_forward = 0, max_backward = 0, max_optimizer = 0;
  double max_allreduce = 0;
};

/// Lower bounds of the step of every completion of a partial assignment
/// (stages 0..s assigned in pipeline order), from paths of the schedule's
/// precedence graph and the relaxation of the unassigned stages
/// (docs/planner.md, "Stage 2"). A value type: copy it to explore.
class path_bounds {
public:
  path_bounds() = default;
  explicit path_bounds(const bound_inputs& in);

  /// Assigns stage `s` (stages 0..s-1 assigned) with costs `v`.
  void push(int s, const stage_value& v);

  /// A lower bound of the step (seconds) of every assignment whose stages
  /// 0..s are those pushed, stage s ending at layer `next_first`.
  double lower_bound(int s, int next_first) const;

private:
  /// The bound of 1F1B and GPipe (their backward is one op); `gpipe`: all
  /// forwards before any backward.
  double fused_bound(int s, int next_first, bool gpipe) const;
  /// The bound of every schedule: each stage's own work after the forwards
  /// that reach it.
  double own_work_bound(int s, int next_first) const;

  schedule_kind schedule_ = schedule_kind::one_f_one_b;
  int stages_ = 0, micro_batches_ = 1, layers_ = 0;
  /// Index s: F + B of one block on every middle stage of s..p-2 (each
  /// holds at least one).
  std::vector<double> suffix_one_block_seconds_;
  /// Index s: the cheapest F + B of a block over stages s..p-1.
  std::vector<double> suffix_cheapest_block_seconds_;
  /// Index j: links of the path from stage 0 to j and back.
  std::vector<double> prefix_link_seconds_;
  relaxation relaxed_one_f_one_b_, relaxed_forward_, relaxed_backward_,
    relaxed_compute_;
  /// Index j: activation links into stages 1..j.
  std::vector<double> forward_link_seconds_;
  double head_seconds_ = 0;            ///< F + B of the head
  double round_trip_link_seconds_ = 0; ///< stage 0 to p-1 and back
  double last_stage_min_optimizer_seconds_ = 0;
  std::vector<path_state> path_; ///< per assigned stage
};

/// The least latency and inverse bandwidth (seconds, seconds per byte) of
/// any link into the first stage's chip of a group's replica from a chip of
/// another replica, for the group's least favourable replica.
struct inbound_link {
  double latency_seconds = inf;
  double seconds_per_byte = inf;
};

/// Per group of `c`: its inbound_link.
std::vector<inbound_link> inbound_links(planner::impl& impl,
                                        const pipeline_candidate& c);

/// A lower bound (seconds) of the step of any plan in which a group whose
/// first stage's all-reduce rides `inbound` takes `option`, with
/// `replicas_total` replicas in all and `wire_ratio` bytes on the wire per
/// fp32 gradient byte: the option's phase, the least all-reduce of its first
/// stage (which ends last under GPipe and 1F1B; a split backward's last W
/// may end elsewhere, so `schedule` zb-h1 counts no all-reduce) and its
/// update.
double joint_option_bound(schedule_kind schedule, const inbound_link& inbound,
                          int replicas_total,
                          double wire_ratio, const group_solution& option);

// ---------------------------------------------------------------------------
// One group (stage_two_search.cpp, stage_two_heuristic.cpp,
// stage_two_branch_bound.cpp)

/// One group of identical replicas at one micro-batch size: the search's
/// view of the stages and the step time of an assignment of layers. Holds a
/// reference to the planner's state, which must outlive it.
class group_search {
public:
  /// `reduce_across_replicas`: the group's replicas all-reduce among
  /// themselves (false when other groups take part in the all-reduce).
  /// `plan_replicas`: replicas of the whole plan, every group's (the
  /// members of each reduction group, what ZeRO-1 shards over).
  group_search(planner::impl& impl, const replica_group& g,
               bool reduce_across_replicas, int plan_replicas);

  int stages() const noexcept { return stages_; }
  int micro_batches() const noexcept { return micro_batches_; }
  int micro_batch_size() const noexcept { return micro_batch_size_; }

  /// Prepares every per-stage figure for micro-batches of
  /// `micro_batch_size` sequences out of `sequences` per replica.
  void setup(int micro_batch_size, int sequences);

  /// The stage at position `s` holding `layers` (minimal recomputation).
  stage_value eval(int s, const stage_layers& layers) const;
  stage_value eval(int s, int first, int end) const;

  /// Layers of the stage at `s` holding `blocks` blocks.
  stage_layers layers_with(int s, int blocks) const;

  /// The step of an assignment (ends of every stage), as simulate() of the
  /// group's replicas computes it when the group is alone; inf when a stage
  /// does not fit.
  group_solution evaluate(const std::vector<int>& ends);

  /// The bottleneck-balancing heuristic: the smallest per-stage compute
  /// bound every stage can meet within memory, surplus blocks taken from
  /// the most loaded stages, then local search by simulation. An empty
  /// solution when nothing fits.
  group_solution heuristic();

  /// Branch and bound from `best` (an incumbent, possibly empty):
  /// improves it to the optimum of this micro-batch size. Returns false
  /// when the node budget ran out first; adds the nodes spent to `nodes`.
  bool branch_and_bound(group_solution& best, std::size_t budget,
                        std::size_t& nodes);

  /// Calls `f` with every assignment whose stages all fit.
  void enumerate(const std::function<void(const std::vector<int>&)>& f);

  /// The recomputation flag of every stage of an assignment.
  std::vector<recompute_policy>
  recompute_of(const std::vector<int>& ends) const;

  /// The path bounds of this micro-batch size (after setup()).
  const path_bounds& bounds() const noexcept { return bounds_; }

private:
  double allreduce_seconds(int s, const stage_layers& layers) const;
  std::vector<int> ends_of(const std::vector<int>& blocks) const;
  void local_search(std::vector<int>& blocks,
                    const std::vector<int>& min_blocks,
                    const std::vector<int>& max_blocks, group_solution& best);
  bound_inputs bound_inputs_of() const;
  int max_end(int s, int first, int lo, int hi) const;
  void branch(int s, int first);
  void enumerate_from(int s, int first,
                      const std::function<void(const std::vector<int>&)>& f);

  planner::impl& planner_;
  std::vector<std::vector<const chip_spec*>> chips_; ///< [replica][stage]
  int stages_, replicas_;
  int layers_; ///< pipeline layers: embedding, blocks, head
  int blocks_; ///< transformer blocks
  bool reduce_across_replicas_;
  bool reduced_; ///< the candidate has replicas: gradients are all-reduced
  /// With the job's plan.zero1: the plan's replicas (1: not sharded).
  int zero1_replicas_;
  int micro_batch_size_ = 1, micro_batches_ = 1;
  // Per stage, at this micro-batch size.
  std::vector<const stage_coefficients*> coefficients_;
  std::vector<double> capacity_bytes_; ///< the least of its replicas' chips
  std::vector<int> in_flight_;         ///< micro-batches held at once
  /// Distinct (activation, gradient) link seconds per stage over the
  /// replicas: replicas whose links are alike simulate alike.
  std::vector<std::pair<std::vector<double>, std::vector<double>>>
    link_patterns_;
  /// Per stage: the ring of that stage position across the replicas.
  std::vector<std::vector<link_figures>> reduction_rings_;
  /// [stage][4 blocks + 2 embedding + head]: all-reduce seconds, -1 until
  /// computed (independent of the micro-batch size).
  mutable std::vector<std::vector<double>> allreduce_seconds_memo_;
  // evaluate()'s buffers, per stage.
  std::vector<double> forward_seconds_, backward_seconds_, input_seconds_,
    weight_seconds_,
    stage_allreduce_seconds_, stage_end_seconds_;
  path_bounds bounds_;
  // Branch-and-bound state.
  group_solution* incumbent_ = nullptr;
  std::size_t node_budget_ = 0;
  std::size_t* nodes_used_ = nullptr;
  std::size_t leaf_node_cost_ = 1; ///< nodes a leaf's simulation is worth
  bool out_of_budget_ = false;
  std::vector<int> assignment_ends_; ///< per stage, of the current branch
};

/// Appends a group's replicas, all with `sol`, to `p`.
void add_replicas(planner::impl& impl, const replica_group& g,
                  group_search& search, const group_solution& sol,
                  int sequences_per_replica, plan& p);

/// n choose k, as a double (it overflows integers for deep pipelines).
double binomial(int n, int k);

/// The best solution of one group at `sequences` per replica (all
/// micro-batch sizes), improving on `bound`. Clears `proven` when a node
/// budget ran out; adds the nodes spent to `nodes`.
group_solution solve_group(planner::impl& impl, group_search& search,
                           int sequences, double bound, bool& proven,
                           std::size_t& nodes);

/// Stage 2 of a candidate of one group (stage_two_search.cpp).
stage_two_result solve_one_group(planner::impl& impl, const replica_group& g,
                                 double bound);

// ---------------------------------------------------------------------------
// Several groups (stage_two_groups.cpp)

/// Splits `total` sequences between groups in proportion to `weight`,
/// each group a positive multiple of `unit` (its replica count). Empty
/// when impossible.
std::vector<int> proportional_split(int total, const std::vector<int>& unit,
                                    const std::vector<double>& weight);

/// Stage 2 of a candidate of several groups.
stage_two_result solve_groups(planner::impl& impl, const pipeline_candidate& c,
                              double bound);

} // namespace h2::scheduler::stage_two_detail
