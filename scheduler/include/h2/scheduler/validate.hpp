// Checks that a schedule can run: the structural rules of schedule.hpp, a
// deadlock-free execution across chips, and the activation bound.
#pragma once

#include "h2/scheduler/schedule.hpp"

namespace h2::scheduler {

/// Throws h2::internal_error, naming the chip, op index, chunk and
/// micro-batch, unless all of the following hold:
/// - the layout is one the schedule's kind can use (layout_problem()), the
///   schedule has one op list per chip, every op's chunk is held by the chip
///   whose list it is in, and every micro-batch index is in range;
/// - every chunk is forwarded exactly once per micro-batch and, unless
///   forward_only, backwarded once after its forward: fused (backward), or
///   split (backward_input, then backward_weight) where the kind splits the
///   backward; never W before its B;
/// - recv/send ops sit exactly where the derived communication puts them: a
///   recv right before its compute op, a send right after it, only towards
///   chunks on other chips;
/// - a chunk whose neighbour is on the same chip comes after it in the list
///   (forward after the previous chunk's forward, backward after the next
///   chunk's);
/// - executing all lists in order, where a recv completes only after the
///   matching send, finishes (no deadlock);
/// - no chip ever holds more chunk activations than in_flight_bound().
/// Pure function; costs O(chips x ops per chip).
void validate(const schedule& s);

/// The most chunk activations (forwarded, not yet backwarded -- for a
/// split backward: not yet through W) chip `chip` of `s` holds at once
/// while executing its list. A forward-only schedule never backwards, so
/// every forward counts. Throws h2::internal_error if `chip` is out of
/// range.
int peak_in_flight(const schedule& s, int chip);

} // namespace h2::scheduler
