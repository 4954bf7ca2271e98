// What a chip does in a step, without an actor: runs its op list over its
// chunks (one or more stages of the plan, docs/planner.md "Schedules") on
// its device, exchanging activations and gradients with its neighbours over
// channels, sums gradients with its replicas, then applies the optimizer
// update. Everything runs on the calling thread (a chip actor's own, or a
// test's), blocking; a chip runs its whole op list itself, not one actor
// message per op (docs/architecture.md, "A step").
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/data.hpp"
#include "h2/model/stage.hpp"
#include "h2/runtime/migration.hpp"
#include "h2/runtime/reports.hpp"
#include "h2/runtime/stage_state.hpp"
#include "h2/runtime/watchdog.hpp"
#include "h2/scheduler/schedule.hpp"
#include "h2/transport/channel.hpp"
#include "h2/transport/collectives.hpp"

#include <map>
#include <memory>
#include <optional>

namespace h2::runtime {

/// A chip this one exchanges tensors with, and the channel to it.
struct peer_link {
  std::shared_ptr<transport::channel> channel;
  chip_profile profile; ///< for link times
};

/// This chip's part in summing a layer group's gradients across replicas
/// (core/plan.hpp, reduction_group).
struct reduction_assignment {
  int group = 0;       ///< index of the group in reduction_groups(plan)
  int first_layer = 0; ///< the group's layers held here, [first, end)
  int end_layer = 0;
  int rank = 0;        ///< this chip's place in the ring (its replica)
  int size = 1;        ///< members of the ring (replicas)
  chip_id next;        ///< ring neighbours
  chip_id prev;
};

/// Everything a chip needs to run its part of the plan.
struct worker_setup {
  std::shared_ptr<const job_config> job;
  const chip_spec* chip = nullptr; ///< points into *job
  int replica = 0;
  int stage = 0;  ///< this chip's pipeline position (replica_chips())
  int stages = 1; ///< chips in the pipeline
  /// This chip's stages of the plan (its chunks), in pipeline order, and
  /// their indices among the replica's stages.
  std::vector<stage_plan> chunks;
  std::vector<int> chunk_index;
  /// Which chip holds which stage of the replica.
  scheduler::pipeline_layout layout;
  /// The chip of every stage of the replica, in pipeline order.
  std::vector<chip_id> chunk_chips;
  int micro_batch_size = 1;
  int micro_batches = 1;
  /// Index of this replica's first sequence within the global batch.
  int first_sequence = 0;
  schedule_kind schedule = schedule_kind::one_f_one_b;
  /// Every stage's op times in this replica, for schedules that place ops
  /// by them (zb-hetero): the same on every chip (schedule_times_of()).
  scheduler::schedule_times times;
  /// Every chip this one exchanges tensors with: pipeline and ring
  /// neighbours.
  std::map<chip_id, peer_link> peers;
  /// Gradient reductions across replicas (none with one replica).
  std::vector<reduction_assignment> reductions;
  /// ZeRO-1 (plan::zero1, with replicas): each reduction shards the
  /// AdamW state of its layers across the ring.
  bool zero1 = false;
  /// What the channels in `peers` take from their peers, for this plan
  /// (channel_limits_of): the worker sets them on its channels.
  transport::channel_limits limits;
  /// Wall time that counts as 0 on every chip's clock.
  devices::chip_clock::wall_clock::time_point origin;
  /// Cancelled when the job aborts: waits end, the op loop stops.
  std::shared_ptr<const cancellation> cancel;
  /// Where the worker publishes the compute op it is in, for the progress
  /// watchdog (null: no watchdog).
  std::shared_ptr<chip_progress> progress;

  /// Closes every channel: waiting neighbours fail with peer_closed.
  void close_channels() const noexcept;

  /// The first layer of the chip's first chunk.
  int first_layer() const { return chunks.front().first_layer; }
};

/// Each stage's forward, B and W seconds of one micro-batch in replica `r`
/// of `p`, by the roofline of its chip's profile (what an emulated chip
/// charges; a real chip's profile is its datasheet): a pure function of the
/// job and the plan, so every node makes the same lists.
scheduler::schedule_times schedule_times_of(const job_config& job,
                                            const replica_plan& r);

/// The setups of every chip of `p`, in plan order (replica by replica,
/// stage by stage), with their peers listed but no channels attached yet
/// (each peer_link's channel is null: the caller connects them).
std::vector<worker_setup>
make_worker_setups(const std::shared_ptr<const job_config>& job,
                   const plan& p,
                   devices::chip_clock::wall_clock::time_point origin,
                   const std::shared_ptr<const cancellation>& cancel);

class stage_worker {
public:
  /// Creates the device context and builds the stage on it, on the calling
  /// thread. Throws device_error (unavailable, out_of_memory).
  explicit stage_worker(worker_setup setup);
  ~stage_worker();

  /// Runs the forward/backward op list of `cmd.step`. On any failure closes
  /// every channel (so neighbours fail fast instead of waiting) and throws.
  chip_step_report run_step(const step_command& cmd);

  /// Clips and applies AdamW to every layer of the chip.
  chip_update_report apply_update(const update_command& cmd);

  /// The forward-only validation pass.
  chip_eval_report run_eval(const eval_command& cmd);

  setup_report ready_report() const;

  /// Copies of the chip's parameters, layer by layer.
  std::vector<parameter_values> parameters() const;

  /// The per-layer state of every layer of the chip, in layer order, in
  /// host memory (docs/checkpoints.md): what a checkpoint writes. Call
  /// between steps.
  std::vector<layer_state> snapshot();

  /// Loads `states` (one per layer of the chip, any order) into the
  /// chip's layers. Call between steps. Throws checkpoint_error(mismatch)
  /// naming the layer when a layer's state is missing or does not fit.
  void restore(const std::vector<layer_state>& states);

  /// Moves the worker to `next`, this chip's setup under another plan with
  /// the same neighbours (a live re-plan, between steps; docs/rebalance.md,
  /// "Moving layers"), in place: sends the layers `m` sends, each to its
  /// new owner over their channel, receives those `m` receives, keeps every
  /// other layer as it is (no copy) and rebuilds only what follows from the
  /// plan (chunks, schedule, op costs). `step` is the first step under the
  /// new plan (the transfers' tags). Returns the bytes it sent over its
  /// channels (channel_stats). On failure closes every channel and throws.
  std::uint64_t migrate(worker_setup next, const chip_migration& m,
                        std::int64_t step);

  /// Closes both channels: waiting neighbours fail with peer_closed, this
  /// worker's own waits with cancelled. Thread-safe.
  void close_channels() noexcept;

  /// Lets go of every channel without closing it, so that a worker built
  /// for another plan (a live re-plan, between steps) can use them; this
  /// worker runs no step after it.
  void detach_channels() noexcept;

  /// An emulated chip runs `factor` times slower than its profile from the
  /// next op on (a drill: [[drills]], h2-admin throttle; 1 restores it).
  /// Throws h2::error on a real chip, whose speed is measured.
  void set_throttle(double factor);
  double throttle() const noexcept { return throttle_; }

  /// The next compute op hangs, as a wedged kernel would, until the
  /// watchdog gives up on it (stalled_error) or the job is cancelled (a
  /// drill: [[drills]] hang).
  void hang_next_op() noexcept { hang_ = true; }

  devices::device_context& device() noexcept { return *device_; }
  const worker_setup& setup() const noexcept { return setup_; }
  /// Every layer of the chip's chunks, in layer order.
  const std::vector<model::layer*>& layers() const noexcept { return layers_; }

private:
  struct op_context;
  /// Everything that follows from setup_ and chunks_ (the stages built for
  /// setup_.chunks): channel limits, recomputation, the layer list, ZeRO-1
  /// shares, the data source, the schedule and op costs.
  void adopt_plan();
  /// Emulated seconds of one micro-batch's ops of one chunk on this chip
  /// (< 0: a real device, measured instead).
  struct op_seconds {
    double forward = 0;
    double backward = 0; ///< fused, recomputation included
    double input = 0;    ///< B, recomputation included
    double weight = 0;   ///< W
  };
  /// Of each of the chip's chunks.
  std::vector<op_seconds> emulated_op_seconds() const;
  /// The chip's chunk `chunk` (a pipeline index) as an index into its own.
  std::size_t local_chunk(int chunk) const;
  /// True when this chip holds chunk `chunk` (false out of range).
  bool chunk_here(int chunk) const;
  /// The chip holding chunk `chunk`.
  const chip_id& chip_of_chunk(int chunk) const;
  /// Runs op `x` of the step's list.
  void run_op(const scheduler::op& x, const step_command& cmd,
              const std::vector<op_seconds>& seconds, op_context& ctx,
              chip_step_report& r);
  void forward_op(const scheduler::op& x, const step_command& cmd,
                  const std::vector<op_seconds>& seconds, op_context& ctx,
                  chip_step_report& r);
  /// The fused backward, or B when `split`.
  void backward_op(const scheduler::op& x, bool split, const step_command& cmd,
                   const std::vector<op_seconds>& seconds, op_context& ctx,
                   chip_step_report& r);
  void weight_op(const scheduler::op& x, const step_command& cmd,
                 const std::vector<op_seconds>& seconds, op_context& ctx,
                 chip_step_report& r);
  /// Runs `body` as compute op `name` of micro-batch `mb`, charged
  /// `predicted` (nullopt: measured): watchdog, device clock and op record.
  /// Returns the op's seconds on the chip's clock.
  template <class F>
  double timed_op(const char* name, recorded_op kind, const scheduler::op& x,
                  std::optional<double> predicted, op_context& ctx, F&& body);
  /// Throws stalled_error once the watchdog gave up on this chip,
  /// cancelled_error once the job is cancelled.
  void check_cancelled() const;
  /// Publishes compute op `op` of `micro_batch` predicted to take
  /// `predicted` (nullopt: measured) to the watchdog, and hangs there when
  /// hang_next_op() asked for it.
  void begin_op(const char* op, int micro_batch,
                std::optional<double> predicted);
  void end_op();
  memory_report memory_now() const;
  /// The micro-batch of `split` that starts at `first_sequence`, on the
  /// chip (chunks with the embedding or the head only).
  model::micro_batch load_batch(model::split split, std::int64_t step,
                                int first_sequence, double scale) const;
  /// Throws internal_error naming `what` unless `t` lives on the chip
  /// (device_context::holds).
  void expect_held(const at::Tensor& t, const char* what) const;
  clock_pair clocks() const;
  /// Emulated seconds of chunk `local`'s layers (< 0: a real device).
  double layer_seconds(std::size_t local, devices::pass p) const;
  /// What an emulated op of `kind` (micro-batch `micro_batch`, step `step`)
  /// is charged: `seconds` x throttle x the job's noise; nullopt (measure)
  /// when `seconds` < 0 (a real device).
  std::optional<double> charged(double seconds, std::int64_t step,
                                recorded_op kind, int micro_batch,
                                int chunk = 0) const;
  /// Splits the step's charged compute over the chip's layers.
  std::vector<layer_charge> layer_charges(double forward_seconds,
                                          double backward_seconds) const;
  at::Tensor receive(const chip_id& peer, std::uint64_t tag, op_context& ctx,
                     int micro_batch);
  void send(const chip_id& peer, std::uint64_t tag, const at::Tensor& t);
  /// Sums this chip's gradients with its replicas', bucket by bucket: a
  /// ring all-reduce, or under ZeRO-1 the reduce-scatter that leaves the
  /// chip its share's sums (a bucket with a parameter kept whole is still
  /// all-reduced).
  void reduce_gradients(std::int64_t step, op_context& ctx);
  /// A reduction group's parameters held here, in the model's order (the
  /// order its buckets are cut in).
  std::vector<model::parameter*>
  parameters_of(const reduction_assignment& red) const;
  /// Calls `f(params, bucket, reduction, ring_io)` for every bucket of
  /// every reduction group (stage_worker_reduce.cpp), with `options`'
  /// group and bucket set for its tags.
  template <class F>
  void for_each_bucket(op_context& ctx, transport::allreduce_options& options,
                       F&& f);
  /// Under ZeRO-1 (constructor): each parameter's share of its group
  /// (optimizer_shards.hpp), but for a tied embedding's table and its copy,
  /// which tie_gradients sums after the reduction: their gradients are
  /// all-reduced whole and their moments stay whole.
  void shard_optimizer_state();
  /// Each layer's squared gradient norm, in layer order; under ZeRO-1 of
  /// the chip's shares (and of the whole parameters on replica 0), which
  /// grad_norm_of sums over the replicas.
  std::vector<double> squared_norms() const;
  /// Under ZeRO-1, after the update: each member's updated share of every
  /// bucket to the whole ring, so every replica holds the same parameters.
  void gather_parameters(std::int64_t step, op_context& ctx);
  /// Under ZeRO-1: the whole moments of the chip's sharded parameters,
  /// gathered from their rings bucket by bucket into host memory, by
  /// tensor name (snapshot_layer). Every member of the rings takes part.
  std::map<std::string, state_tensor> gather_moments(op_context& ctx);
  /// With tied embeddings, after reduce_gradients: the embedding's and the
  /// head's copy take the sum of their gradients, exchanged between the
  /// replica's two chips (one chip holding both sums in place).
  void tie_gradients(std::int64_t step, op_context& ctx);
  template <class F>
  auto guarded(F&& f) -> decltype(f());

  worker_setup setup_;
  std::unique_ptr<devices::device_context> device_;
  /// One model stage per chunk, in pipeline order.
  std::vector<std::unique_ptr<model::stage>> chunks_;
  /// Every layer of the chip, in layer order.
  std::vector<model::layer*> layers_;
  std::unique_ptr<model::data_source> data_;
  scheduler::schedule schedule_;
  /// Of each layer of each chunk, for one micro-batch.
  std::vector<std::vector<layer_work>> work_;
  /// A block's attention core (what attention recomputation adds).
  layer_work attention_work_;
  std::chrono::duration<double> timeout_;
  double loss_scale_ = 1; ///< 1 / tokens of the global batch
  /// The step of the last update (the tags of gather_moments).
  std::int64_t last_step_ = 0;
  double throttle_ = 1;
  bool hang_ = false;
  /// Each layer's share of the chip's forward (backward) time: its
  /// emulated seconds, or its FLOPs on a real device.
  std::vector<double> forward_share_, backward_share_;
};

} // namespace h2::runtime
