// Checks that a schedule can run: the structural rules of schedule.hpp, a
// deadlock-free execution across stages, and the activation bound.
#pragma once

#include "h2/scheduler/schedule.hpp"

namespace h2::scheduler {

/// Throws h2::internal_error, naming the stage, op index and micro-batch,
/// unless all of the following hold:
/// - the schedule has `stages` op lists and every micro-batch index is in
///   [0, micro_batches);
/// - every stage forwards every micro-batch exactly once and, unless
///   forward_only, backwards it exactly once, after its forward;
/// - recv/send ops sit exactly where the op semantics require them: a recv
///   right before its compute op, a send right after it, same micro-batch,
///   none on the pipeline's ends;
/// - executing all lists in order, where a recv completes only after the
///   neighbour's matching send, finishes (no deadlock);
/// - no stage ever holds more activations than in_flight_bound().
/// Pure function; costs O(stages x ops per stage).
void validate(const schedule& s);

/// The most activations (forwarded, not yet backwarded micro-batches) stage
/// `stage` of `s` holds at once while executing its list. A forward-only
/// schedule never backwards, so every forward counts. Throws
/// h2::internal_error if `stage` is out of range.
int peak_in_flight(const schedule& s, int stage);

} // namespace h2::scheduler
