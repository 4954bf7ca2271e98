// Pipeline schedules (docs/architecture.md, "Schedule"): a pure function of (kind,
// stages, micro-batches) that returns the ordered op list of every stage for
// one step. The runtime and the simulator execute the same lists.
//
// Op semantics. A forward of micro-batch i on stage s is recv_forward(i)
// (absent on the first stage), forward(i), send_forward(i) (absent on the last
// stage, whose forward includes the loss). A backward is recv_backward(i)
// (absent on the last stage), backward(i), send_backward(i) (absent on the
// first stage). Sends are asynchronous and never block; a receive blocks until
// the neighbour's matching send (same micro-batch) has happened.
#pragma once

#include "h2/core/job.hpp"

#include <iosfwd>
#include <string_view>
#include <vector>

namespace h2::scheduler {

/// What one op of a stage's list does.
enum class op_kind {
  recv_forward,  ///< wait for micro-batch i's activations from stage s-1
  forward,       ///< forward of micro-batch i (plus the loss on the last stage)
  send_forward,  ///< hand micro-batch i's activations to stage s+1
  recv_backward, ///< wait for micro-batch i's gradients from stage s+1
  backward,      ///< backward of micro-batch i
  send_backward, ///< hand micro-batch i's input gradients to stage s-1
};

/// "recv_forward", "forward", ... (the enumerator's name).
std::string_view to_string(op_kind k) noexcept;

/// One entry of a stage's op list.
struct op {
  op_kind kind;
  int micro_batch; ///< 0-based index within the step

  bool operator==(const op&) const = default;
};

/// Prints "forward(3)"; used in error messages and test failures.
std::ostream& operator<<(std::ostream& out, const op& x);

/// What every stage of one pipeline executes in one step.
struct schedule {
  /// The schedule the lists follow; decides the activation bound that
  /// validate() checks (in_flight_bound()).
  schedule_kind kind = schedule_kind::one_f_one_b;
  int stages = 0;
  int micro_batches = 0;
  /// ops[s] = what stage s executes, in order, for one step.
  std::vector<std::vector<op>> ops;
  /// True for a forward-only step (validation loss): no backward ops at all.
  bool forward_only = false;
};

/// The training step of `kind` on `stages` stages with `micro_batches`
/// micro-batches.
/// - gpipe: all forwards in micro-batch order, then all backwards in
///   micro-batch order.
/// - one_f_one_b (PipeDream-Flush / Megatron, non-interleaved): stage s runs
///   min(stages - s - 1, micro_batches) warm-up forwards, then alternates one
///   forward / one backward, then the remaining backwards (cool-down).
/// Throws h2::internal_error unless stages >= 1 and micro_batches >= 1.
schedule make_schedule(schedule_kind kind, int stages, int micro_batches);

/// A forward-only step (validation loss): every stage forwards every
/// micro-batch in order. The result has kind gpipe and forward_only set.
/// Throws h2::internal_error unless stages >= 1 and micro_batches >= 1.
schedule make_forward_schedule(int stages, int micro_batches);

/// The most activations (forwarded, not yet backwarded micro-batches) stage
/// `stage` may hold at once under `kind`: gpipe micro_batches, one_f_one_b
/// min(stages - stage, micro_batches). Throws h2::internal_error on
/// arguments out of range.
int in_flight_bound(schedule_kind kind, int stages, int stage,
                    int micro_batches);

/// The idle share of a step, (p - 1) / (m + p - 1) for p stages and m
/// micro-batches: the theory for both gpipe and one_f_one_b when every stage
/// takes the same time. Throws h2::internal_error unless p, m >= 1.
double bubble_fraction(int stages, int micro_batches);

} // namespace h2::scheduler
