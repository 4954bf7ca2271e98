// HeteroAuto (docs/planner.md): the two-stage search for a plan, as in the H2
// paper (arXiv:2505.17548).
//
// Stage 1 decides the shape: which chips form how many replicas and in which
// order they form each pipeline (topology-aware: a chip kind's chips stay
// together in node order, so neighbouring stages share fast links;
// memory-rich kinds can go where activations pile up, the early stages of
// 1F1B). Stage 2 decides, for one shape, the layers of every stage, the
// micro-batch size and count and per-stage recomputation, minimising the
// simulated step time within every chip's memory.
//
// Stage 2 is exact with respect to the simulator for a single group of
// identical replicas (branch and bound with path lower bounds, the
// simulator at the leaves) unless its node budget runs out, and for several
// groups when their joint space is small enough to enumerate; otherwise it
// is a heuristic (bottleneck balancing, then local search by simulation).
// Every result says whether it was proven optimal.
#pragma once

#include "h2/core/error.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/scheduler/cost_model.hpp"
#include "h2/scheduler/measurements.hpp"
#include "h2/scheduler/simulator.hpp"

#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace h2::scheduler {

/// What the planner may choose, and how hard it searches.
struct planner_options {
  /// The schedule; default: the job's plan.schedule. plan_auto() plans
  /// every schedule and keeps the fastest when this is unset and the job
  /// says schedule = "auto", or when `search_schedules` is set.
  std::optional<schedule_kind> schedule;
  bool search_schedules = false;
  /// Allowed micro-batch sizes (sequences); empty: every divisor of a
  /// replica's sequences.
  std::vector<int> micro_batch_sizes;
  /// What stages may recompute in the backward (cost_model.hpp).
  recompute_levels recompute = recompute_levels::selective;
  /// Most replicas (0: no limit; 1: pipeline parallelism only).
  int max_replicas = 0;
  /// The chips to plan for; empty: plan.stages of an auto job, every chip
  /// of other jobs.
  std::vector<chip_id> chips;
  /// Up to this many chips, stage 1 enumerates every set of disjoint
  /// ordered chip lists (every replica layout); above it, structured
  /// layouts (docs/planner.md).
  int exhaustive_chips = 4;
  /// Branch-and-bound nodes per (candidate, micro-batch size) before stage
  /// 2 settles for the best plan found (then not proven optimal).
  std::size_t search_nodes = 200000;
  /// Joint (partition, micro-batch) options that stage 2 enumerates exactly
  /// for candidates with several groups of replicas; above it, a heuristic.
  std::size_t joint_options = 20000;
  /// On an infeasible job, look for one change that makes it fit.
  bool suggest_changes = true;
  /// Solve every candidate to its own optimum (not only as far as it could
  /// beat the best so far) and list them in plan_report::ranking: slower,
  /// for explaining and debugging.
  bool rank_candidates = false;
};

/// One stage-1 candidate's outcome (plan_report::ranking).
struct candidate_outcome {
  std::string shape; ///< pipeline_candidate::description
  bool feasible = false;
  double step_seconds = 0;
  bool proven_optimal = false;
};

/// One stage of a plan as the simulator predicts it.
struct stage_prediction {
  chip_id chip;
  std::string device;
  int first_layer = 0;
  int end_layer = 0;
  recompute_policy recompute;  ///< what the stage recomputes (capped to it)
  double forward_seconds = 0;  ///< one micro-batch
  double backward_seconds = 0; ///< one micro-batch, recomputation included
  double compute_seconds = 0;  ///< forward + backward time of the step
  double idle_seconds = 0;     ///< pipeline phase minus compute
  double allreduce_seconds = 0;
  double optimizer_seconds = 0;
  double peak_bytes = 0;
  double capacity_bytes = 0;
  int in_flight = 0; ///< most micro-batches held at once
};

struct replica_prediction {
  int micro_batch_size = 1;
  int micro_batches = 1;
  std::vector<stage_prediction> stages;
};

/// A plan's prediction and why it is what it is.
struct plan_report {
  schedule_kind schedule = schedule_kind::one_f_one_b;
  bool zero1 = false; ///< plan::zero1 with replicas: moments sharded
  double step_seconds = 0;
  double pipeline_seconds = 0;
  double allreduce_seconds = 0;
  double optimizer_seconds = 0;
  double tokens_per_second = 0;
  double bubble_fraction = 0;
  bool fits = true;
  std::vector<replica_prediction> replicas;
  /// The binding stage: the busiest of all (its compute sets the pace).
  int binding_replica = 0;
  int binding_stage = 0;
  /// The stage with the least memory headroom, and that headroom as a
  /// fraction of its capacity (negative: it does not fit).
  int tightest_replica = 0;
  int tightest_stage = 0;
  double memory_headroom = 1;
  /// Search statistics (plan_auto only).
  std::size_t candidates = 0;  ///< stage-1 candidates
  std::size_t simulations = 0; ///< pipeline simulations run
  std::size_t measurements = 0;
  bool proven_optimal = false;
  std::string shape; ///< the winning stage-1 candidate, in words
  /// Chips given to the planner that the plan leaves idle (plan_auto
  /// only), and why: the best plan that uses every chip is predicted
  /// slower, or none fits (explain() adds how that plan's step compares
  /// with this plan's, all_chips_step_seconds).
  int idle_chips = 0;
  std::string idle_reason;
  /// Whether ZeRO-1 was weighed against the plan without it, and the
  /// outcome ("on: ..." or "off: ..."; plan_auto with bf16 reductions).
  std::string zero1_reason;
  /// The step of the best plan that uses every chip, when chips are idle
  /// (0: none fits).
  double all_chips_step_seconds = 0;
  /// Every candidate, fastest first (planner_options::rank_candidates).
  std::vector<candidate_outcome> ranking;
  /// The simulated step (its timeline when asked for).
  simulation sim;

  /// Why the plan is what it is, a few lines: binding stage, memory
  /// headroom, bubble, replicas.
  std::string explain() const;

  /// One line for logs: "predicted step 523.250 ms, 3914 tokens/s, bubble
  /// 47.9%".
  std::string summary() const;
};

/// A plan and its report.
struct planned {
  plan value;
  plan_report report;
};

/// Replicas that are copies of one pipeline shape: the same chip kinds in
/// the same order, the same layers per stage, micro-batch size and count.
struct replica_group {
  /// Per replica, indices into planner::chips() in stage order.
  std::vector<std::vector<int>> replicas;
};

/// A stage-1 candidate: the replica layout, as groups of identical
/// replicas (the global batch is split between groups by stage 2).
struct pipeline_candidate {
  std::vector<replica_group> groups;
  std::string description; ///< e.g. "1 x [h100-sxm x2, a100-sxm-40gb x2]"

  int replicas() const noexcept;
};

/// Stage 2's answer for one candidate.
struct stage_two_result {
  bool feasible = false;
  double step_seconds = std::numeric_limits<double>::infinity();
  plan value;
  /// The minimum over every (partition, micro-batch size, recomputation)
  /// of the candidate, as the simulator computes step times.
  bool proven_optimal = false;
  std::size_t nodes = 0;       ///< branch-and-bound nodes
  std::size_t simulations = 0; ///< pipeline simulations
};

/// A change that makes an infeasible job fit, checked by planning with it.
struct suggested_change {
  enum class kind { enable_recompute, halve_micro_batch, add_chips };
  kind what = kind::enable_recompute;
  std::string device;                ///< add_chips: e.g. "emulated:mi300x"
  dtype compute_dtype = dtype::bf16; ///< add_chips: their dtype
  int count = 0;                     ///< add_chips: how many
  double step_seconds = 0;           ///< the step time planned with the change

  /// "enable recomputation", "halve the micro-batch to 2", "add 4 chips of
  /// emulated:mi300x".
  std::string describe() const;
};

/// No plan fits the job's chips. what(): "plan: no plan fits: <what does
/// not fit where>; suggested change: <change> (checked: ...)".
class infeasible_error : public config_error {
public:
  infeasible_error(std::string problem, std::optional<suggested_change> change);

  /// What does not fit where.
  const std::string& problem() const noexcept { return problem_; }
  /// The one change that fits, when one was found.
  const std::optional<suggested_change>& change() const noexcept {
    return change_;
  }

private:
  std::string problem_;
  std::optional<suggested_change> change_;
};

/// The job and options with `change` applied (what the planner checked):
/// added chips form new nodes of at most eight chips.
void apply_change(const suggested_change& change, job_config& job,
                  planner_options& options);

/// HeteroAuto for one job. Holds the cost model (and so the memoised
/// measurements) across calls. Not thread-safe.
class planner {
public:
  /// `job` and `measurements` must outlive the planner. Throws
  /// config_error when options.chips names a chip the job lacks.
  planner(const job_config& job, chip_measurements& measurements,
          planner_options options = {});
  ~planner();
  planner(const planner&) = delete;
  planner& operator=(const planner&) = delete;

  /// The chips planned for, in the order candidates index them.
  const std::vector<const chip_spec*>& chips() const noexcept;

  const planner_options& options() const noexcept;
  schedule_kind schedule() const noexcept;
  cost_model& costs() noexcept;

  /// Stage 1: every candidate layout worth solving.
  std::vector<pipeline_candidate> stage_one();

  /// Stage 2 for one candidate. `bound`: a step time the caller already
  /// has; results no better may be skipped (then feasible = false).
  stage_two_result
  stage_two(const pipeline_candidate& candidate,
            double bound = std::numeric_limits<double>::infinity());

  /// Both stages: the best plan over every candidate. Throws
  /// infeasible_error when nothing fits.
  planned run();

  /// Predicts any plan valid for the job (even, manual, a file).
  plan_report evaluate(const plan& p, bool timeline = false);

  /// The simulated step of `p` alone (evaluate() without the report).
  simulation simulate(const plan& p, bool timeline = false);

  /// Pipeline simulations run so far.
  std::size_t simulations() const noexcept;

  /// The implementation (scheduler/planner_impl.hpp, private to
  /// scheduler/).
  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

/// "1.234 s", "12.345 ms" or "5.000 us": how reports and h2-plan print a
/// duration.
std::string seconds_text(double seconds);

/// "12.3 GiB", "4.5 MiB" or "7.0 KiB" (emulated capacities are small): how
/// reports and h2-plan print memory.
std::string bytes_text(double bytes);

/// One schedule planned alone (plan_each_schedule()).
struct schedule_choice {
  schedule_kind schedule = schedule_kind::one_f_one_b;
  std::optional<planned> result; ///< empty: nothing fits
  std::exception_ptr error;      ///< the infeasible_error when empty
};

/// HeteroAuto once per schedule, with `options` otherwise: feasible ones first,
/// fastest predicted step first.
std::vector<schedule_choice>
plan_each_schedule(const job_config& job, chip_measurements& measurements,
                   const planner_options& options = {});

/// `start` improved one stage boundary at a time (a layer moved to the
/// neighbouring stage) while `p` predicts a shorter step that fits, in
/// replicas of up to 16 stages (larger ones are kept as they are): how
/// plans with several chunks per chip are tuned (interleaved-1f1b,
/// zb-hetero) and live-rebalanced.
planned improve_boundaries(planner& p, planned start);

/// True when `options` and `job` ask the planner to choose the schedule.
bool searches_schedules(const job_config& job,
                        const planner_options& options) noexcept;

/// plan.mode = "auto": HeteroAuto's plan for `job` with its report (over
/// every schedule when searches_schedules()). Throws infeasible_error (a
/// config_error) when no plan fits (1F1B's, when searching).
planned plan_auto(const job_config& job, chip_measurements& measurements,
                  const planner_options& options = {});

/// The simulator's prediction of `p` (validate_plan()ed against `job`).
plan_report evaluate_plan(const job_config& job, const plan& p,
                          chip_measurements& measurements,
                          bool timeline = false);

} // namespace h2::scheduler
