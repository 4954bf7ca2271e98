// Private to scheduler/: what planner.cpp, stage_one.cpp and the stage-2
// sources (stage_two*.cpp, stage_two_impl.hpp) share.
#pragma once

#include "h2/scheduler/planner.hpp"

#include <string>
#include <vector>

namespace h2::scheduler {

struct planner::impl {
  impl(const job_config& job, chip_measurements& m, planner_options opt);

  const job_config* job; ///< not owned; outlives the planner
  planner_options options;
  schedule_kind pipeline_schedule;     ///< the schedule of every plan
  std::vector<const chip_spec*> chips; ///< the chips planned for, in id order
  cost_model costs;
  /// Simulates one pipeline's phase for stage 2's inner loop; counts its
  /// runs.
  phase_simulator pipeline_simulator;
  /// Pipelines simulated by simulate_plan() (one per replica).
  std::size_t simulations = 0;

  /// Chips the planner treats alike: same profile, dtype and capacity.
  std::vector<int> chip_class;                 ///< per chip: its class
  std::vector<std::string> class_name;         ///< per class, e.g. "h100-sxm"
  std::vector<double> class_capacity_bytes;    ///< per class
  std::vector<std::vector<int>> class_members; ///< per class: chips in id order

  /// Sequences of the global batch.
  int sequences() const noexcept { return job->train.global_batch; }
  int layers() const noexcept { return job->model.num_layers(); }

  /// The micro-batch sizes allowed for a replica of `sequences`, ascending.
  std::vector<int> micro_batch_sizes(int sequences) const;

  /// The simulator's view of `p`: stage costs and links per replica, and
  /// the all-reduce of every reduction group (layers held by the same chip
  /// in every replica) in layer order.
  struct simulator_input {
    std::vector<simulated_pipeline> pipelines;
    std::vector<simulated_reduction> reductions;
  };
  simulator_input pipelines_of(const plan& p);

  /// Simulates `p`; counts the simulation.
  simulation simulate_plan(const plan& p, bool timeline);

  /// The report of `p` from its simulation.
  plan_report report_of(const plan& p, simulation sim);

  /// "2 x [h100-sxm x2, mi250x]" for a candidate.
  std::string describe(const pipeline_candidate& c) const;

  // Stage 1 and stage 2 (stage_one.cpp, stage_two.cpp).
  std::vector<pipeline_candidate> stage_one();
  stage_two_result stage_two(const pipeline_candidate& c, double bound);

  // Stage 1's parts (stage_one.cpp).
  /// Bytes of the model's weights, gradients and moments that the chips of
  /// any replica must hold together, with at most `max_replicas` replicas.
  double model_static_bytes(int max_replicas) const;
  /// Whether the chips of `replica` together hold `model_static` bytes.
  bool replica_may_fit(const std::vector<int>& replica,
                       double model_static) const;
  /// Few chips: every layout of disjoint ordered chip lists up to symmetry,
  /// single pipelines first.
  std::vector<pipeline_candidate>
  stage_one_exhaustive(int max_replicas, double model_static) const;
  /// Per class: a block's forward and backward speed at one sequence per
  /// micro-batch, as measured (1 / seconds; 0 when no time).
  std::vector<double> class_speeds();
  /// Structured layout (a): one pipeline of the classes in some order.
  /// Appends to `out` without descriptions.
  void stage_one_single_pipelines(const std::vector<double>& speed,
                                  double model_static,
                                  std::vector<pipeline_candidate>& out) const;
  /// Structured layout (b): R >= 2 identical replicas of mixed classes.
  /// Appends to `out` without descriptions.
  void stage_one_identical_replicas(int max_replicas,
                                    const std::vector<double>& speed,
                                    double model_static,
                                    std::vector<pipeline_candidate>& out) const;
  /// Structured layout (c): every class forms its own identical replicas.
  /// Appends to `out` without descriptions.
  void stage_one_class_replicas(int max_replicas, double model_static,
                                std::vector<pipeline_candidate>& out) const;
};

/// Sets report.idle_chips and, when some are, report.idle_reason: the best
/// plan among `candidates` that uses every chip, or that none fits
/// (idle_chips.cpp).
void explain_idle_chips(planner::impl& im,
                        const std::vector<pipeline_candidate>& candidates,
                        const stage_two_result& best, plan_report& report);

} // namespace h2::scheduler
