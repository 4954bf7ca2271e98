// Pipeline schedules as data (docs/planner.md, "Schedules"): for one step, the
// ordered op list of every chip of a pipeline. The runtime, the simulator and
// the validator execute the same lists.
//
// Chunks. A pipeline is a sequence of chunks, each a contiguous range of
// layers, in layer order; a chip holds one or more chunks (the layout says
// which). A micro-batch's forward runs chunk 0, 1, ..., its backward the other
// way round.
//
// Op semantics. forward(c, i) runs chunk c on micro-batch i (the last chunk's
// forward includes the loss). backward(c, i) is the fused backward: input and
// weight gradients. A schedule that splits the backward runs
// backward_input(c, i) (B: the input gradients, which the previous chunk
// waits for) and later backward_weight(c, i) (W: the weight gradients, which
// nobody waits for). Communication is derived from the compute ops in one
// place (make_schedule): where chunk c - 1 lives on another chip, forward(c, i)
// is preceded by recv_forward(c, i) and chunk c - 1's forward is followed by
// send_forward(c - 1, i); likewise recv_backward(c, i) precedes the backward
// (or B) of chunk c when chunk c + 1 is elsewhere, and send_backward(c, i)
// follows it when chunk c - 1 is elsewhere. Between chunks of one chip the
// tensors stay on the chip: no send, no receive, the list's order is the
// dependency. Sends never block; a receive blocks until the matching send.
#pragma once

#include "h2/core/job.hpp"

#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace h2::scheduler {

/// What one op of a chip's list does.
enum class op_kind {
  recv_forward,    ///< wait for chunk c's input activations of micro-batch i
  forward,         ///< forward of chunk c on micro-batch i
  send_forward,    ///< hand chunk c's output activations to chunk c + 1
  recv_backward,   ///< wait for chunk c's output gradients
  backward,        ///< fused backward of chunk c: input and weight gradients
  send_backward,   ///< hand chunk c's input gradients to chunk c - 1
  backward_input,  ///< B: chunk c's input gradients only
  backward_weight, ///< W: chunk c's weight gradients, after its B
};

/// "recv_forward", "forward", ... (the enumerator's name).
std::string_view to_string(op_kind k) noexcept;

/// True for forward, backward, backward_input and backward_weight.
bool is_compute(op_kind k) noexcept;

/// One entry of a chip's op list.
struct op {
  op_kind kind;
  int micro_batch; ///< 0-based index within the step
  int chunk = 0;   ///< index of the chunk in pipeline order

  bool operator==(const op&) const = default;
};

/// Prints "forward(3)" for chunk 0 and "forward(c2, 3)" otherwise; used in
/// error messages and test failures.
std::ostream& operator<<(std::ostream& out, const op& x);

/// Which chip of a pipeline holds which chunk.
struct pipeline_layout {
  int chips = 0;
  /// chunk_chip[c]: the chip (0-based pipeline position) holding chunk c;
  /// chunks are in pipeline (layer) order.
  std::vector<int> chunk_chip;

  int chunks() const noexcept { return static_cast<int>(chunk_chip.size()); }
  /// How many chunks `chip` holds.
  int chunks_of(int chip) const noexcept;
  /// True when chip i holds exactly chunk i.
  bool one_chunk_per_chip() const noexcept;
  bool operator==(const pipeline_layout&) const = default;

  /// Chunk i on chip i.
  static pipeline_layout one_per_chip(int chips);
  /// Chip i holds counts[i] >= 1 chunks, dealt round by round: round r
  /// gives one chunk to every chip with more than r chunks, in chip order
  /// (Megatron's interleaved order when every count is the same v).
  /// Throws h2::internal_error on an empty list or a count below 1.
  static pipeline_layout dealt(const std::vector<int>& counts);
};

/// What every chip of one pipeline executes in one step.
struct schedule {
  schedule_kind kind = schedule_kind::one_f_one_b;
  pipeline_layout layout;
  int micro_batches = 0;
  /// ops[k] = what chip k executes, in order, for one step.
  std::vector<std::vector<op>> ops;
  /// True for a forward-only step (validation loss): no backward ops at all.
  bool forward_only = false;

  int chips() const noexcept { return layout.chips; }
  int chunks() const noexcept { return layout.chunks(); }
};

/// Relative compute times of each chunk, for schedules that place ops by
/// the chips' speeds (zb-hetero places W into the waits that these times
/// predict). Empty vectors: every forward, B and W takes the same time.
struct schedule_times {
  std::vector<double> forward; ///< per chunk
  std::vector<double> input;   ///< B per chunk
  std::vector<double> weight;  ///< W per chunk
};

/// Why `kind` cannot run on `layout` with `micro_batches` micro-batches
/// (one line, for a config_error), or "" when it can:
/// - gpipe, 1f1b and zb-h1 need one chunk per chip; zb-hetero runs any
///   layout, chips holding different numbers of chunks too;
/// - interleaved-1f1b needs every chip to hold the same number v >= 2 of
///   chunks, dealt round by round (pipeline_layout::dealt), and at least as
///   many micro-batches as chips.
std::string layout_problem(schedule_kind kind, const pipeline_layout& layout,
                           int micro_batches);

/// The training step of `kind` on `layout` with `micro_batches`
/// micro-batches, communication derived from the compute ops:
/// - gpipe: all forwards in micro-batch order, then all backwards.
/// - one_f_one_b (PipeDream-Flush / Megatron, non-interleaved): chip s runs
///   min(chips - s - 1, micro_batches) warm-up forwards, then alternates one
///   forward / one backward, then the remaining backwards (cool-down).
/// - interleaved_1f1b: Megatron-LM's interleaved 1F1B over v chunks per
///   chip, micro-batches taken in groups of `chips` (the last group may be
///   smaller: the flexible form), warm-up (chips - s - 1) x 2 + (v - 1) x
///   chips forwards.
/// - zb_h1: 1F1B's order of forwards and B, W split off and placed where
///   the chip would otherwise wait (predicted with equal times), holding at
///   most min(chips, micro_batches) micro-batches until their W.
/// - zb_hetero: zb_h1 with the waits predicted from `times`, each chip's
///   own: on mixed chips W fills the idle time a slower neighbour causes.
///   On a layout of several chunks per chip (even or not): the order a
///   greedy run on `times` gives (B first, forwards within min(chips,
///   micro_batches) per chunk; W into the waits it fits, right after its
///   B, or last, whichever run is shortest).
/// Throws h2::internal_error when layout_problem() is not empty or
/// micro_batches < 1.
schedule make_schedule(schedule_kind kind, const pipeline_layout& layout,
                       int micro_batches, const schedule_times& times = {});

/// make_schedule() on pipeline_layout::one_per_chip(chips).
schedule make_schedule(schedule_kind kind, int chips, int micro_batches);

/// A forward-only step (validation loss): every chip forwards every
/// micro-batch through its chunks in order. The result has kind gpipe and
/// forward_only set. Throws h2::internal_error unless the layout has chips
/// and micro_batches >= 1.
schedule make_forward_schedule(const pipeline_layout& layout,
                               int micro_batches);
schedule make_forward_schedule(int chips, int micro_batches);

/// The most chunk activations chip `chip` may hold at once under `kind`:
/// a chunk's forward of a micro-batch holds its activations until its fused
/// backward or, when the backward is split, its W (H2's W keeps the chunk's
/// autograd graph). gpipe: micro_batches x chunks; one_f_one_b:
/// min(chips - chip, micro_batches); interleaved_1f1b: its warm-up plus one,
/// at most v x micro_batches; zb_h1: min(chips, micro_batches); zb_hetero:
/// that per chunk the chip holds.
/// Throws h2::internal_error on arguments out of range.
int in_flight_bound(schedule_kind kind, const pipeline_layout& layout, int chip,
                    int micro_batches);
int in_flight_bound(schedule_kind kind, int chips, int chip, int micro_batches);

/// The idle share of a step when every chunk's forward, B and W take the
/// same time on every chip and links are free (the textbook values):
/// gpipe and one_f_one_b (p - 1) / (m + p - 1); interleaved_1f1b with v
/// chunks per chip (p - 1) / (v m + p - 1) (m a multiple of p); zb_h1
/// (p - 1) / (3 m + p - 1) (Qi et al., ICLR 2024, for m >= p). Throws
/// h2::internal_error unless chips, micro_batches and chunks_per_chip >= 1.
double theoretical_bubble(schedule_kind kind, int chips, int micro_batches,
                          int chunks_per_chip = 1);

/// True when `kind` splits the backward into B and W.
bool splits_backward(schedule_kind kind) noexcept;

} // namespace h2::scheduler
