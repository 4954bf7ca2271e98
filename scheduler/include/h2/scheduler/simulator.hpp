// The schedule simulator (docs/planner.md, "Simulator"): discrete-event
// execution of the op lists of make_schedule() -- the lists the runtime runs
// -- with per-op costs and link transfers, reproducing the runtime's virtual
// clock, chunk by chunk on the chips that hold them:
// - a compute op (forward, backward, B, W) advances its chip's clock by its
//   chunk's time;
// - a send is instantaneous and stamps the sender's clock;
// - a receive completes at max(receiver clock, send clock + link time);
// - after its list a chip all-reduces its gradients with the chips
//   of the other replicas holding the same layers (R > 1): one reduction
//   group after the other in layer order, each starting when all its
//   members are ready (a ring synchronises them) and lasting what the cost
//   model says (cost_model::allreduce_seconds);
// - then the global gradient norm is taken (a barrier over every chip), then
//   every chip updates its layers;
// - the step time is the largest clock at the end of the updates.
#pragma once

#include "h2/core/job.hpp"
#include "h2/scheduler/schedule.hpp"

#include <limits>
#include <vector>

namespace h2::scheduler {

/// One chunk as the simulator sees it (with one chunk per chip, as the
/// planner plans today: the chip's stage): what each op costs and what it
/// holds in memory.
struct simulated_stage {
  double forward_seconds = 0;  ///< one forward (one micro-batch)
  double backward_seconds = 0; ///< one fused backward, recomputation included
  /// B and W when the schedule splits the backward (B with the
  /// recomputation).
  double input_seconds = 0;
  double weight_seconds = 0;
  double optimizer_seconds = 0; ///< the chunk's update, once per step
  /// Link time of a micro-batch's activations from the previous chunk's
  /// chip, as this chip times it (unused when that chunk is on this chip).
  double activation_link_seconds = 0;
  /// Link time of a micro-batch's gradients from the next chunk's chip.
  double gradient_link_seconds = 0;
  /// Memory: a chip's peak = the static bytes of its chunks + max(the held
  /// bytes of the chunk activations it holds + the largest working bytes,
  /// the largest optimizer working bytes); see stage_cost.
  double static_bytes = 0;
  double held_bytes = 0; ///< per chunk activation in flight
  double working_bytes = 0;
  /// After the pipeline: the optimizer's and, with replicas, the
  /// all-reduce's (stage_cost::peak_bytes), the larger.
  double optimizer_working_bytes = 0;
  /// The chip's capacity (the smallest over its chunks counts).
  double capacity_bytes = std::numeric_limits<double>::infinity();
};

/// One replica's pipeline.
struct simulated_pipeline {
  schedule_kind kind = schedule_kind::one_f_one_b;
  int micro_batches = 1;
  /// The chunks, in pipeline order.
  std::vector<simulated_stage> stages;
  /// Which chip holds which chunk; empty (no chips): one chunk per chip.
  pipeline_layout layout;
};

/// A gradient all-reduce of one reduction group: layers held by the same
/// chip in every replica, reduced over the ring of those chips.
struct simulated_reduction {
  /// (replica, chip) of every member, in ring order.
  std::vector<std::pair<int, int>> members;
  /// Its duration once every member is ready.
  double seconds = 0;
};

/// What a stretch of a chip's timeline was (for traces and drawings).
enum class interval_kind {
  forward,
  backward,        ///< fused backward
  backward_input,  ///< B of a split backward
  backward_weight, ///< W of a split backward
  wait,
  allreduce,
  optimizer,
};

/// "forward", "backward", "backward_input", "backward_weight", "wait",
/// "allreduce", "optimizer".
std::string_view to_string(interval_kind k) noexcept;

/// One stretch of one chip's timeline, seconds from the step's start.
struct timeline_interval {
  int replica = 0;
  int stage = 0; ///< the chip's position in the pipeline
  interval_kind kind = interval_kind::forward;
  int micro_batch = -1; ///< -1 for allreduce and optimizer
  int chunk = -1;       ///< the compute op's chunk (-1: not a compute op)
  double start_seconds = 0;
  double end_seconds = 0;
};

/// What one chip did in the simulated step.
struct stage_outcome {
  double forward_seconds = 0;  ///< busy in forwards (all micro-batches)
  double backward_seconds = 0; ///< busy in backwards (B and W included)
  /// The pipeline phase (to the last backward of any chip) minus this
  /// stage's forward and backward time, as the runtime reports idle time.
  double idle_seconds = 0;
  /// Time spent waiting in receives (part of idle_seconds).
  double wait_seconds = 0;
  double phase_end_seconds = 0; ///< its last backward's end
  /// Its all-reduces' end (phase_end_seconds without replicas).
  double reduced_seconds = 0;
  double allreduce_seconds = 0; ///< busy in all-reduces
  double optimizer_seconds = 0;
  double end_seconds = 0; ///< its update's end
  int peak_in_flight = 0; ///< chunk activations
  double peak_bytes = 0;
  bool fits = true; ///< peak_bytes <= capacity
};

/// A simulated step.
struct simulation {
  double step_seconds = 0; ///< the step's start to the last update's end
  /// To the last backward or all-reduce of any chip (the runtime's
  /// pipeline phase: the all-reduces run inside it).
  double pipeline_seconds = 0;
  double allreduce_seconds = 0; ///< the longest all-reduce time of a chip
  double optimizer_seconds = 0; ///< the longest update
  /// Idle share of the pipeline phase over all chips, as the runtime
  /// reports it: 1 - busy / (pipeline_seconds x chips).
  double bubble_fraction = 0;
  bool fits = true; ///< every stage within its capacity
  /// [replica][chip].
  std::vector<std::vector<stage_outcome>> replicas;
  std::vector<timeline_interval> timeline; ///< filled when asked for
};

/// Simulates one step of every replica; `reductions` in the order chips
/// run them (by layer). `record_timeline` fills simulation::timeline.
/// Throws h2::internal_error on an empty pipeline, fewer than one
/// micro-batch or a reduction member out of range. Cost: O(ops of all
/// stages + reduction members).
simulation simulate(const std::vector<simulated_pipeline>& replicas,
                    const std::vector<simulated_reduction>& reductions = {},
                    bool record_timeline = false);

/// The pipeline phase of one pipeline alone, for the planner's inner loop:
/// the time its last backward ends. Keeps the op lists of the last shape
/// and its buffers between calls; not thread-safe.
class phase_simulator {
public:
  /// One chunk per chip. `forward`, `backward`, `input`, `weight`,
  /// `activation_link`, `gradient_link` each point to `stages` values with
  /// the meaning of simulated_stage's fields (`input` and `weight` are read
  /// only when `kind` splits the backward).
  double makespan(schedule_kind kind, int stages, int micro_batches,
                  const double* forward, const double* backward,
                  const double* input, const double* weight,
                  const double* activation_link, const double* gradient_link);

  /// Every stage's clock at the end of its list in the last run.
  const std::vector<double>& stage_ends() const noexcept { return clock_; }

  /// How many makespans were computed.
  std::size_t runs() const noexcept { return runs_; }

private:
  schedule schedule_;
  bool have_schedule_ = false; ///< schedule_ is reusable for its shape
  schedule_times times_;       ///< zb-hetero's, of the last run
  std::vector<double> clock_, sent_forward_, sent_backward_;
  std::vector<std::size_t> next_;
  std::vector<char> blocked_;
  std::vector<int> ready_;
  std::size_t runs_ = 0;
};

} // namespace h2::scheduler
