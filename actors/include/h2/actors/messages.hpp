// What chip actors and the scheduler actor tell each other: plain structs
// with CAF inspect() overloads, so the same messages can later cross nodes.
#pragma once

#include "h2/core/chip_id.hpp"

#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace h2 {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_id& x) {
  return f(caf::meta::type_name("chip_id"), x.node, x.index);
}

} // namespace h2

namespace h2::actors {

/// Ops that are not in a schedule's op list.
enum class extra_op : std::uint8_t {
  optimizer = 100, ///< the AdamW update of the stage
  eval_forward = 101,
  allreduce = 102, ///< summing gradients with the other replicas
};

/// One timed op of a chip, for traces. Times are seconds in the run's clock
/// (virtual or wall, as the job's emulation.clock says).
struct op_record {
  std::uint8_t kind = 0; ///< scheduler::op_kind or extra_op
  std::int32_t micro_batch = 0;
  double start = 0;
  double end = 0;
  /// The op's time on the virtual clock: emulated (or measured on real
  /// devices) for compute ops, the idle jump for receives.
  double virtual_seconds = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, op_record& x) {
  return f(caf::meta::type_name("op_record"), x.kind, x.micro_batch, x.start,
           x.end, x.virtual_seconds);
}

/// Times of a chip on both clocks, seconds since the run's origin.
struct clock_pair {
  double virtual_seconds = 0;
  double wall_seconds = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, clock_pair& x) {
  return f(caf::meta::type_name("clock_pair"), x.virtual_seconds,
           x.wall_seconds);
}

/// Memory of a chip, bytes.
struct memory_report {
  std::uint64_t used = 0;
  std::uint64_t peak = 0; ///< since the start of the step
  std::uint64_t capacity = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_report& x) {
  return f(caf::meta::type_name("memory_report"), x.used, x.peak, x.capacity);
}

/// Bytes a chip exchanged with one neighbour.
struct channel_traffic {
  chip_id peer;
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_traffic& x) {
  return f(caf::meta::type_name("channel_traffic"), x.peer, x.sent, x.received);
}

/// A chip is ready: its stage is built.
struct setup_report {
  chip_id chip;
  std::int64_t parameters = 0;
  memory_report memory;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, setup_report& x) {
  return f(caf::meta::type_name("setup_report"), x.chip, x.parameters,
           x.memory);
}

/// Starts the forward/backward phase of a step on every chip.
struct step_command {
  std::int32_t step = 0;
  /// Virtual time all chips start from (the previous step's end).
  double virtual_barrier = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_command& x) {
  return f(caf::meta::type_name("step_command"), x.step, x.virtual_barrier);
}

/// What a chip did in the forward/backward phase of a step.
struct chip_step_report {
  chip_id chip;
  std::int32_t replica = 0;
  std::int32_t stage = 0;
  std::int32_t first_layer = 0;
  /// Squared gradient norm of each of the stage's layers, in layer order.
  std::vector<double> layer_squared_norms;
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
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_step_report& x) {
  return f(caf::meta::type_name("chip_step_report"), x.chip, x.replica, x.stage,
           x.first_layer, x.layer_squared_norms, x.loss, x.start, x.phase_end,
           x.forward_seconds, x.backward_seconds, x.idle_seconds, x.memory,
           x.traffic, x.overruns, x.overrun_seconds, x.ops);
}

/// The optimizer phase of a step.
struct update_command {
  std::int32_t step = 0;
  double lr = 0;
  double clip_coefficient = 1;
  /// Virtual time of the global gradient-norm reduction: every chip waits
  /// for the slowest before updating.
  double virtual_barrier = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, update_command& x) {
  return f(caf::meta::type_name("update_command"), x.step, x.lr,
           x.clip_coefficient, x.virtual_barrier);
}

struct chip_update_report {
  chip_id chip;
  double optimizer_seconds = 0;
  clock_pair end;
  memory_report memory;
  op_record op;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_update_report& x) {
  return f(caf::meta::type_name("chip_update_report"), x.chip,
           x.optimizer_seconds, x.end, x.memory, x.op);
}

/// A validation pass over train.eval_batches global batches.
struct eval_command {
  std::int32_t step = 0; ///< the training step it follows (for the tags)
  double virtual_barrier = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, eval_command& x) {
  return f(caf::meta::type_name("eval_command"), x.step, x.virtual_barrier);
}

struct chip_eval_report {
  chip_id chip;
  double loss = 0; ///< last stage: this replica's share of the mean loss
  clock_pair end;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_eval_report& x) {
  return f(caf::meta::type_name("chip_eval_report"), x.chip, x.loss, x.end);
}

/// The values of one parameter (fp32 master weights), for tests and tools.
struct parameter_values {
  std::string name; ///< "block3.attn.qkv.weight"
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, parameter_values& x) {
  return f(caf::meta::type_name("parameter_values"), x.name, x.shape, x.values);
}

} // namespace h2::actors
