// HeteroAuto's cost model (docs/planner.md, "Cost model"): what a stage of
// the pipeline costs on a chip, in time (from measurements, never from the
// emulated chips' own roofline) and in memory (analytic, from the model's
// shape and the precision rules of the runtime), and what a transfer
// between two chips costs (core/topology.hpp).
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/topology.hpp"
#include "h2/scheduler/measurements.hpp"

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace h2::scheduler {

/// What the planner may recompute (planner_options::recompute).
enum class recompute_levels {
  none,      ///< nothing
  full,      ///< whole stages only (the stage flag of old)
  selective, ///< whole stages, whole blocks, attention cores
};

/// "none", "full", "selective".
std::string_view to_string(recompute_levels l) noexcept;
std::optional<recompute_levels>
parse_recompute_levels(std::string_view s) noexcept;

/// Bytes one layer needs on a chip, as the runtime holds them: fp32 master
/// weights with fp32 gradients and two fp32 AdamW moments; activations in
/// the chip's compute dtype (bf16 autocast keeps a bf16 copy of every weight
/// matrix per micro-batch in flight, saved for the backward); transfers and
/// stage inputs in fp32.
struct layer_memory {
  std::int64_t parameters = 0;
  /// Weights, gradients and AdamW moments (16 bytes per parameter) plus
  /// fixed buffers (a block's causal mask).
  double static_bytes = 0;
  /// Kept from a micro-batch's forward to its backward without
  /// recomputation, including the layer's output.
  double activation_bytes = 0;
  /// Temporaries at the layer's forward or backward peak, on top of what is
  /// kept (a weight gradient being accumulated, gradients of its largest
  /// activations).
  double working_bytes = 0;
  /// Temporaries of the layer's AdamW update (a few copies of its largest
  /// tensor).
  double optimizer_working_bytes = 0;
  /// Of static_bytes, the AdamW moments ZeRO-1 splits across replicas: 8
  /// bytes per parameter, a tied embedding's table excepted (its moments
  /// stay whole on both of its chips).
  double shardable_bytes = 0;
  /// Blocks: of activation_bytes, what the attention core keeps beyond its
  /// inputs q, k and v (the softmax probabilities): what attention
  /// recomputation saves per micro-batch, and rebuilds in the backward.
  double attention_bytes = 0;
};

/// The memory of one layer of kind `kind` for micro-batches of
/// `micro_batch_size` sequences on a chip computing in `d`.
layer_memory layer_memory_of(const gpt_config& cfg, layer_kind kind,
                             int micro_batch_size, dtype d);

/// Bytes of the activations (and of their gradients) crossing a stage
/// boundary for one micro-batch: fp32 [sequences, seq_len, d_model].
double boundary_bytes(const gpt_config& cfg, int micro_batch_size);

/// Bytes of one micro-batch's tokens and targets (int64), held by the
/// stages with the embedding or the head.
double batch_bytes(const gpt_config& cfg, int micro_batch_size);

/// Elements of each parameter tensor of a layer of kind `kind`, in the
/// order the model holds them (model/layers.cpp): the order gradients are
/// bucketed for the all-reduce.
std::vector<std::int64_t> parameter_tensors(const gpt_config& cfg,
                                            layer_kind kind);

/// Which layers a stage holds, by kind: [first, end) of the model's layers.
struct stage_layers {
  bool embedding = false;
  int blocks = 0;
  bool head = false;

  static stage_layers of(const gpt_config& cfg, int first_layer, int end_layer);
  int count() const noexcept {
    return blocks + (embedding ? 1 : 0) + (head ? 1 : 0);
  }
};

/// What one stage costs on one chip for one micro-batch size.
struct stage_cost {
  double forward_seconds = 0;   ///< one micro-batch
  double backward_seconds = 0;  ///< one micro-batch, recomputation included
  /// B and W of a split backward (B with the recomputation).
  double input_seconds = 0;
  double weight_seconds = 0;
  double optimizer_seconds = 0; ///< the update of every layer of the stage
  double static_bytes = 0;
  /// Kept per micro-batch in flight (its input and, without recomputation,
  /// every activation; with it only the input and the batch).
  double held_bytes = 0;
  /// On top of what is held, at a forward or backward (with recomputation:
  /// one micro-batch's activations rebuilt for its backward).
  double working_bytes = 0;
  double optimizer_working_bytes = 0;
  /// What the all-reduce of the stage's gradients holds while it runs
  /// (with replicas): its largest bucket flattened and the ring's chunks,
  /// at most twice that bucket.
  double reduction_working_bytes = 0;
  /// fp32 gradients of the stage (what an all-reduce moves).
  double gradient_bytes = 0;
  /// Of static_bytes, the moments ZeRO-1 shards (layer_memory).
  double shardable_bytes = 0;
  recompute_policy recompute;

  /// The stage under ZeRO-1 with `replicas` members in each of its
  /// reduction groups: each keeps 1 / replicas of the shardable moments and
  /// updates that share (the all-gather of the parameters is in
  /// cost_model::allreduce_seconds). Unchanged for one replica.
  stage_cost sharded(int replicas) const noexcept;

  /// Peak bytes with `in_flight` micro-batches held: static + max(held x
  /// in_flight + working, optimizer working, and with `reduced` (the plan
  /// has replicas) reduction working).
  double peak_bytes(int in_flight, bool reduced = false) const noexcept;
};

/// Per-kind figures of one chip at one micro-batch size: everything
/// stage_cost needs, so the planner's inner loop costs a stage in O(1).
struct stage_coefficients {
  layer_timing embedding, block, head;
  double optimizer_embedding = 0, optimizer_block = 0, optimizer_head = 0;
  layer_memory memory_embedding, memory_block, memory_head;
  double boundary_bytes = 0; ///< a stage input held per micro-batch
  double batch_bytes = 0;
  /// transport.bucket_bytes: the all-reduce's bucket limit.
  double bucket_bytes = 0;

  /// The stage holding `layers`, recomputing what `recompute` says (its
  /// blocks count is capped at the stage's blocks).
  stage_cost cost(const stage_layers& layers,
                  const recompute_policy& recompute) const noexcept;

  /// The stage holding `layers` with the recomputation that adds the least
  /// time among those with which it fits `capacity_bytes` holding
  /// `in_flight` micro-batches: none, the attention cores, the fewest whole
  /// blocks (with or without the other attention cores), the whole stage.
  /// nullopt when nothing `levels` allows fits. `reduced`: the plan has
  /// replicas (stage_cost::peak_bytes); `zero1_replicas` > 1: the stage's
  /// optimizer state is sharded that many ways (stage_cost::sharded).
  std::optional<stage_cost> fitting(const stage_layers& layers, int in_flight,
                                    double capacity_bytes,
                                    recompute_levels levels,
                                    bool reduced = false,
                                    int zero1_replicas = 1) const;
};

/// The cost model of one job: its chips, their measurements (memoised), the
/// analytic memory, the links. Not thread-safe (the cache).
class cost_model {
public:
  /// `measurements` must outlive the model.
  cost_model(const job_config& job, chip_measurements& measurements);

  const job_config& job() const noexcept { return *job_; }
  const gpt_config& model() const noexcept { return job_->model; }

  /// Bytes the chip may hold: its memory x memory_scale for emulated chips,
  /// what the measurements say for real chips that they open (GPUs: free
  /// memory minus the reserve), its profile's memory otherwise.
  double capacity_bytes(const chip_spec& chip) const;

  /// The coefficients of `chip` at `micro_batch_size` (measured on first
  /// use, then memoised per chip kind).
  const stage_coefficients& coefficients(const chip_spec& chip,
                                         int micro_batch_size);

  /// The stage [first_layer, end_layer) on `chip`.
  stage_cost stage(const chip_spec& chip, int first_layer, int end_layer,
                   int micro_batch_size, const recompute_policy& recompute);

  /// The link of a transfer from `from` to `to` (core/topology.hpp).
  link_figures link(const chip_spec& from, const chip_spec& to) const {
    return resolve_link(*job_, from, to);
  }

  /// Seconds of a micro-batch's boundary transfer from `from` to `to`.
  double boundary_seconds(const chip_spec& from, const chip_spec& to,
                          int micro_batch_size) const;

  /// The links of a ring (chips in ring order): edge i from ring[i - 1]
  /// to ring[i], as ring[i] times it.
  std::vector<link_figures>
  ring_links(const std::vector<const chip_spec*>& ring) const;

  /// The fp32 gradient bytes of each all-reduce bucket of `layers`, cut as
  /// the runtime cuts them (cut_buckets, scheduler/buckets.hpp): whole
  /// parameter tensors in the model's order.
  std::vector<double> buckets(const stage_layers& layers) const;

  /// Seconds of the all-reduce of `buckets` (fp32 bytes) over a ring with
  /// `links`: per bucket 2 (R - 1) ring steps, each moving a 1/R share in
  /// the wire dtype (transport.reduce_dtype) over every edge at once, as
  /// slow as the slowest edge. 0 for a ring of one. `zero1`: the second
  /// half gathers the updated fp32 parameters instead of the gradients.
  double allreduce_seconds(const std::vector<link_figures>& links,
                           const std::vector<double>& buckets,
                           bool zero1 = false) const;

  /// The all-reduce of the gradients of layers [first_layer, end_layer)
  /// over `ring`.
  double allreduce_seconds(const std::vector<const chip_spec*>& ring,
                           int first_layer, int end_layer,
                           bool zero1 = false) const;

  /// How many measurements were taken so far.
  std::size_t measurements_taken() const noexcept {
    return cache_.measurements_taken();
  }

  measurement_cache& measurements() noexcept { return cache_; }

private:
  const job_config* job_;
  /// Mutable: capacity_bytes() is a query that may measure (once).
  mutable measurement_cache cache_;
  std::map<std::pair<std::string, int>, stage_coefficients> coefficients_;
};

} // namespace h2::scheduler
