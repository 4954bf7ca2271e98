// Live rebalancing, the policy (docs/rebalance.md): pure logic that watches
// a running job's per-step observations, recalibrates HeteroAuto's
// measurements with them, searches the best plan a live rebalance may reach
// (the running chips in their order: layer boundaries, micro-batching,
// recomputation) with the planner's own stage 2, and proposes it when its
// predicted gain, after the cost of moving layers, holds above a threshold
// for a window of steps. No actors, no I/O: the scheduler actor feeds it and
// carries its proposals out.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/scheduler/cost_model.hpp"
#include "h2/scheduler/measurements.hpp"
#include "h2/scheduler/planner.hpp"

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace h2::scheduler {

// The settings live with the job (core/job.hpp, [rebalance]).
using h2::check_rebalance_config;
using h2::parse_rebalance_mode;
using h2::rebalance_config;
using h2::rebalance_mode;
using h2::to_string;

/// Exponentially weighted moving average: the first sample is the value,
/// each later one moves it by `weight` x (sample - value).
class ewma {
public:
  explicit ewma(double weight = 0.5) : weight_(weight) {}

  /// Adds a sample; returns the new value.
  double add(double sample) noexcept;

  bool empty() const noexcept { return samples_ == 0; }
  /// 0 while empty.
  double value() const noexcept { return value_; }
  long samples() const noexcept { return samples_; }

private:
  double weight_;
  double value_ = 0;
  long samples_ = 0;
};

/// What one chip did in one step, as its stage worker reports it. Times are
/// what the chip charged (emulated chips: their emulated op times, never
/// the host's wall time; real chips: measured).
struct chip_observation {
  chip_id chip;
  /// Per layer of the chip's stage, in layer order: seconds of one
  /// micro-batch's forward and backward (the backward as charged, the
  /// recomputed forward included when the stage recomputes), e.g. the
  /// mean over the step's micro-batches. Empty: no timings this step.
  std::vector<layer_timing> layers;
  /// The stage's optimizer update, seconds (0: not observed).
  double optimizer_seconds = 0;
  /// Waiting for neighbours in the step, seconds (status only).
  double idle_seconds = 0;
  /// Peak bytes of the step (0: not observed).
  double peak_bytes = 0;
};

/// One micro-batch's boundary transfer (activations or gradients) from
/// chip `from` to chip `to`, neighbours in a replica of the current plan.
struct link_observation {
  chip_id from;
  chip_id to;
  double seconds = 0;
};

/// Everything observed in one step under the current plan.
struct step_observations {
  int step = 0;
  std::vector<chip_observation> chips;
  std::vector<link_observation> links;
};

/// Smoothed ratios of observed to profiled figures per chip, which scale
/// HeteroAuto's measurements (a chip that runs 2x slower than profiled has
/// factor 2). A ratio is a property of the chip, not of its layers, so it
/// survives a rebalance. Factors are rounded to 1/1024 (calibration_quantum)
/// so that chips of one kind that run alike stay alike to the planner.
class live_calibration {
public:
  /// `job` and `profiled` (HeteroAuto's measurements) must outlive this.
  live_calibration(const job_config& job, chip_measurements& profiled,
                   double smoothing = 0.5);

  /// Adds one step's observations, taken under `current`. Throws
  /// h2::internal_error when a chip is not in `current` or reports another
  /// number of layers than its stage holds.
  void add(const plan& current, const step_observations& observations);

  /// Observed / profiled forward (backward) seconds of `kind` on `chip`,
  /// rounded; the chip's pooled factor over its layers for a kind it has
  /// not run; 1 before any observation.
  double forward_factor(const chip_id& chip, layer_kind kind) const;
  double backward_factor(const chip_id& chip, layer_kind kind) const;
  /// Observed / profiled optimizer seconds (rounded), 1 unobserved.
  double optimizer_factor(const chip_id& chip) const;
  /// Observed / profiled forward + backward seconds over the chip's layers
  /// (not rounded): how much slower than profiled the chip computes.
  double compute_factor(const chip_id& chip) const;
  /// Observed / predicted peak memory, at least 1 (rounded up): the
  /// planner's memory model times this is what the chip will need.
  double memory_factor(const chip_id& chip) const;
  /// Observed / modelled boundary transfer seconds from `from` to `to`
  /// (either direction observed), 1 unobserved.
  double link_factor(const chip_id& from, const chip_id& to) const;
  /// Smoothed idle seconds and peak bytes per step (0 unobserved).
  double idle_seconds(const chip_id& chip) const;
  double peak_bytes(const chip_id& chip) const;

  /// Steps added.
  int steps() const noexcept { return steps_; }

  const job_config& job() const noexcept { return *job_; }
  /// The profiled measurements, memoised.
  measurement_cache& profiled() noexcept { return costs_.measurements(); }

private:
  /// Per chip: factors per layer kind (index: layer_kind) and pooled.
  struct chip_state {
    explicit chip_state(double w)
        : forward{ewma(w), ewma(w), ewma(w)},
          backward{ewma(w), ewma(w), ewma(w)},
          forward_all(w),
          backward_all(w),
          compute(w),
          optimizer(w),
          memory(w),
          idle_seconds(w),
          peak_bytes(w) {}
    ewma forward[3];
    ewma backward[3];
    ewma forward_all, backward_all, compute, optimizer, memory;
    ewma idle_seconds, peak_bytes;
  };
  const chip_state* find(const chip_id& chip) const;
  chip_state& state(const chip_id& chip);
  /// Adds a chip's per-layer compute times (`seen`, its chunks' layers in
  /// order) against the profile's predictions.
  void add_compute(chip_state& cs, const chip_spec& spec,
                   const replica_plan& rep,
                   const std::vector<const stage_plan*>& chunks,
                   schedule_kind schedule,
                   const std::vector<layer_timing>& seen);

  const job_config* job_;
  cost_model costs_; ///< the job under the profiled measurements
  double smoothing_;
  int steps_ = 0;
  std::map<chip_id, chip_state> chips_;
  std::map<std::pair<chip_id, chip_id>, ewma> links_;
};

/// The grid live factors are rounded to.
inline constexpr double calibration_quantum = 1.0 / 1024;

/// HeteroAuto's measurements scaled by a live_calibration: chip `c`'s
/// layer times are the profiled times of its kind x c's factors. Use with
/// live_job(), whose chips' kind keys tell calibrated chips apart.
class live_measurements final : public chip_measurements {
public:
  /// `calibration` must outlive this.
  explicit live_measurements(live_calibration& calibration)
      : calibration_(&calibration) {}

  layer_timing layer(const chip_spec& chip, layer_kind kind,
                     int micro_batch_size) override;
  double optimizer(const chip_spec& chip, layer_kind kind) override;

private:
  live_calibration* calibration_;
};

/// The calibration's job as the planner must see it: each chip whose
/// factors are not all 1 gets a profile name of its own ("a~<factors>"),
/// since the planner memoises measurements per kind (chip_kind_key()), and
/// its memory divided by memory_factor(). Chips of one kind with the same
/// factors keep sharing a name.
job_config live_job(const live_calibration& calibration);

/// The best plan a live rebalance may reach from `current`: the same
/// replicas with the same chips in the same order, HeteroAuto's stage 2
/// choosing layer boundaries, micro-batch size and count and
/// recomputation (replicas with the same chip kinds in the same order are
/// solved as one group of identical replicas). `current` itself when
/// nothing predicted faster fits. nullopt when no plan fits. options.chips
/// and options.schedule are taken from `current`.
std::optional<planned> best_plan_within(const job_config& job,
                                        chip_measurements& measurements,
                                        const plan& current,
                                        planner_options options = {});

/// Bytes of a layer's state that move with it: fp32 master weights and the
/// two AdamW moments (gradients are zero at a step boundary).
inline constexpr double moved_bytes_per_parameter = 12;

/// Consecutive layers of one replica that change owner together.
struct layer_move {
  int replica = 0;
  int first_layer = 0; ///< inclusive
  int end_layer = 0;   ///< exclusive
  chip_id from;
  chip_id to;
  double bytes = 0;   ///< moved_bytes_per_parameter x parameters
  double seconds = 0; ///< over the cost model's link from -> to
};

/// The layers that change owner from plan `from` to plan `to` (the same
/// replicas with the same chips: throws h2::internal_error otherwise).
std::vector<layer_move> layer_moves(const job_config& job, const plan& from,
                                    const plan& to);

/// A plan the policy proposes.
struct rebalance_proposal {
  int step = 0; ///< the step whose observations decided it
  plan value;
  /// "throttled chip 0:1" (a chip slowed by 25% or more since the current
  /// plan was adopted), "recovered chip 0:1" (sped up as much), "live
  /// metrics", or propose_now()'s reason.
  std::string reason;
  std::vector<layer_move> moves;
  double moved_bytes = 0;
  /// The moves one after another (an upper bound of the pause), with the
  /// observed link factors.
  double move_seconds = 0;
  /// Predicted step seconds of the current plan and of `value` under the
  /// live measurements.
  double before_seconds = 0;
  double after_seconds = 0;
  /// (before - after) / before.
  double gain = 0;
  /// gain - move_seconds / max(1, min_interval) / before: what the
  /// threshold is held against.
  double net_gain = 0;
  /// `value`'s prediction under the live measurements.
  plan_report report;
};

/// Where the policy stands (h2-admin status).
struct rebalance_status {
  rebalance_mode policy = rebalance_mode::off;
  /// Consecutive evaluated steps with net gain above the threshold.
  int streak = 0;
  /// Step of the last proposal (-1: none).
  int last_proposal_step = -1;
  /// Plans adopted since the start (the first plan is generation 0).
  int generation = 0;
  /// The last evaluation (-1: none yet).
  int evaluated_step = -1;
  double before_seconds = 0;
  double after_seconds = 0;
  double gain = 0;
  double net_gain = 0;
};

/// The live-rebalancing policy of one job (docs/rebalance.md). Call
/// observe() once per step with that step's observations; when it returns
/// a proposal, carry it out and call adopt() with the plan now running
/// (before observing the next step under it). Not thread-safe.
class rebalance_policy {
public:
  /// `job` and `profiled` (HeteroAuto's measurements) must outlive the
  /// policy; `current` is the running plan; `options` what HeteroAuto may
  /// choose (micro-batch sizes, recomputation, search budget). Throws
  /// config_error for a bad `config`.
  rebalance_policy(const job_config& job, chip_measurements& profiled,
                   plan current, rebalance_config config = {},
                   planner_options options = {});

  /// Adds the step's observations; with the policy on, and at least
  /// min_interval steps after the last proposal or adoption, evaluates the best
  /// plan within the live limits and returns it when its net gain has exceeded
  /// the threshold for `window` consecutive steps.
  std::optional<rebalance_proposal> observe(const step_observations& obs);

  /// The best plan within the live limits now, whatever the threshold,
  /// window, interval and mode (h2-admin rebalance --auto); nullopt when
  /// no plan is predicted faster than the current one. A proposal returned
  /// counts as one: min_interval counts from `step`.
  std::optional<rebalance_proposal> propose_now(int step,
                                                std::string reason = "admin");

  /// `p` runs from `step` on (a proposal carried out, or any other plan
  /// within the live limits): it becomes the current plan, the reference
  /// for "throttled chip" reasons, and min_interval counts from `step`.
  void adopt(plan p, int step);

  /// h2-admin policy auto|off.
  void set_mode(rebalance_mode mode);

  const rebalance_config& config() const noexcept { return config_; }
  const plan& current() const noexcept { return current_; }
  const live_calibration& calibration() const noexcept { return calibration_; }
  const rebalance_status& status() const noexcept { return status_; }

private:
  std::optional<rebalance_proposal> evaluate(int step);
  std::string reason() const;

  const job_config* job_;
  plan current_;
  rebalance_config config_;
  planner_options options_;
  live_calibration calibration_;
  rebalance_status status_;
  /// The last proposal or adoption: min_interval counts from it (-1: none).
  int last_change_step_ = -1;
  /// compute_factor() per chip when the current plan was adopted.
  std::map<chip_id, double> reference_;
  /// The last search, reused while the live job (its chips' calibrated
  /// names and capacities) and the plan are the same: steady runs search
  /// once per change, not once per step.
  std::string searched_key_;
  int searched_generation_ = -1;
  double searched_before_seconds_ = 0;
  std::optional<planned> searched_best_;
};

} // namespace h2::scheduler
