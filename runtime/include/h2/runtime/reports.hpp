// What a chip is told to do in a step and what it reports back: plain
// structs, no actors. The actors carry them in messages (their CAF inspect
// overloads live in actors/messages.hpp), tests and tools use them directly.
#pragma once

#include "h2/core/chip_id.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace h2::runtime {

/// What a timed op of a chip was: the schedule's compute and receive ops
/// (sends are not timed), and the ops outside a schedule's op list.
enum class recorded_op : std::uint8_t {
  recv_forward,  ///< waiting for a micro-batch's activations
  forward,       ///< forward of a micro-batch
  recv_backward, ///< waiting for a micro-batch's gradients
  backward,      ///< backward of a micro-batch
  optimizer,     ///< the AdamW update of the stage
  allreduce,     ///< summing gradients with the other replicas
  backward_input,  ///< B of a split backward: the input gradients
  backward_weight, ///< W of a split backward: the weight gradients
};

/// "recv_forward", "forward", ..., "optimizer", "allreduce",
/// "backward_input", "backward_weight".
std::string_view to_string(recorded_op op) noexcept;

/// One timed op of a chip, for traces. Times are seconds in the run's clock
/// (virtual or wall, as the job's emulation.clock says).
struct op_record {
  recorded_op kind = recorded_op::forward;
  std::int32_t micro_batch = 0;
  double start = 0;
  double end = 0;
  /// The op's time on the virtual clock: emulated (or measured on real
  /// devices) for compute ops, the idle jump for receives.
  double virtual_seconds = 0;
  std::int32_t chunk = 0; ///< the plan's stage (chunk) the op ran
};

/// Times of a chip on both clocks, seconds since the run's origin.
struct clock_pair {
  double virtual_seconds = 0;
  double wall_seconds = 0;
};

/// Memory of a chip, bytes.
struct memory_report {
  std::uint64_t used = 0;
  std::uint64_t peak = 0; ///< since the start of the step
  std::uint64_t capacity = 0;
};

/// Bytes a chip exchanged with one neighbour.
struct channel_traffic {
  chip_id peer;
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  /// Of `sent`, bytes that left from device memory, not staged through
  /// host memory (CUDA IPC, rdma device-direct).
  std::uint64_t sent_on_device = 0;
};

/// One layer's share of a step's charged compute: seconds of one
/// micro-batch's forward and backward (the backward includes the recomputed
/// forward when the stage recomputes), the mean over the step's
/// micro-batches. Emulated chips: what the chip charged (its emulated op
/// times, throttle and noise included), never the host's wall time; real
/// chips: the measured op times, split over the layers by their FLOPs.
struct layer_charge {
  double forward_seconds = 0;
  double backward_seconds = 0;
};

/// The pipeline transfers a chip received from one neighbour in a step:
/// their link seconds as charged (emulated) and how many there were.
struct link_charge {
  chip_id from;
  double seconds = 0;
  std::int32_t transfers = 0;
};

/// A chip is ready: its stage is built.
struct setup_report {
  chip_id chip;
  std::int64_t parameters = 0;
  memory_report memory;
  /// Bytes the chip sent its neighbours moving layers chip to chip (a live
  /// re-plan, stage_worker::migrate); 0 otherwise.
  std::uint64_t sent_bytes = 0;
};

/// Starts the forward/backward phase of a step on every chip.
struct step_command {
  std::int32_t step = 0;
  /// Virtual time all chips start from (the previous step's end).
  double virtual_barrier = 0;
};

/// What a chip did in the forward/backward phase of a step.
struct chip_step_report {
  chip_id chip;
  std::int32_t replica = 0;
  std::int32_t stage = 0;       ///< the chip's pipeline position
  std::int32_t first_layer = 0; ///< of its first chunk
  /// The global index of each of the chip's layers, in layer order (its
  /// chunks' layers, one chunk after the other).
  std::vector<std::int32_t> layer_ids;
  /// Squared gradient norm of each of the chip's layers, as layer_ids.
  std::vector<double> layer_squared_norms;
  /// Under ZeRO-1 the norms are of the chip's shares: grad_norm_of sums
  /// them over the replicas (else it takes replica 0's).
  bool norm_shares = false;
  /// Sum of the scaled micro-batch losses (last stage only): this replica's
  /// share of the step's mean token loss.
  double loss = 0;
  clock_pair start;
  clock_pair phase_end; ///< after the stage's last backward
  double forward_seconds = 0;
  double backward_seconds = 0;
  double idle_seconds = 0; ///< waiting for neighbours
  memory_report memory;
  std::vector<channel_traffic> traffic; ///< this step, per neighbour
  std::uint64_t overruns = 0; ///< wall clock: ops slower than emulated
  double overrun_seconds = 0;
  std::vector<op_record> ops;
  /// Per layer of the chip, as layer_ids (live rebalancing).
  std::vector<layer_charge> layers;
  /// Per neighbour that sent activations or gradients this step.
  std::vector<link_charge> links;
};

/// The optimizer phase of a step.
struct update_command {
  std::int32_t step = 0;
  double lr = 0;
  double clip_coefficient = 1;
  /// Virtual time of the global gradient-norm reduction: every chip waits
  /// for the slowest before updating.
  double virtual_barrier = 0;
};

struct chip_update_report {
  chip_id chip;
  double optimizer_seconds = 0;
  clock_pair end;
  memory_report memory;
  op_record op;
};

/// A validation pass over train.eval_batches global batches.
struct eval_command {
  std::int32_t step = 0; ///< the training step it follows (for the tags)
  double virtual_barrier = 0;
};

struct chip_eval_report {
  chip_id chip;
  double loss = 0; ///< last stage: this replica's share of the mean loss
  clock_pair end;
};

/// The values of one parameter (fp32 master weights), for tests and tools.
struct parameter_values {
  std::string name; ///< "block3.attn.qkv.weight"
  std::vector<std::int64_t> shape;
  std::vector<float> values;
  std::int32_t layer = 0; ///< the global layer it belongs to
};

} // namespace h2::runtime
