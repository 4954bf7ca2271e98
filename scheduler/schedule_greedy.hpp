// Private to scheduler/: zero-bubble lists for any chunk layout, found by
// running the step on the chunks' own times (schedule_greedy.cpp).
#pragma once

#include "h2/scheduler/schedule.hpp"

#include <vector>

namespace h2::scheduler {

/// When a greedy run places a deferred W.
enum class w_placement {
  fill,  ///< when it fits the wait before the chip's next forward or B
  eager, ///< as soon as its B is done, before any forward or B
  last,  ///< only when the chip has nothing else to run
};

/// The compute-only lists (forward, B, W) of every chip of `layout` for `m`
/// micro-batches: the order in which each chip ran them when the step was
/// run on `times` (per chunk; empty: every op 1) with free links, and that
/// run's step. A chip that is free runs a B that is ready (the previous
/// chunk waits for it), else a forward while that chunk holds fewer than
/// `bound` micro-batches between forward and W, else waits; a W runs as
/// `placement` says (and always when nothing else is left). Each chunk
/// runs its micro-batches in order in each kind (the single chip's order
/// of weight gradients). The lists are a run's record, so executing them
/// with blocking receives cannot deadlock.
struct greedy_run {
  std::vector<std::vector<op>> lists;
  double step = 0;
};
greedy_run greedy_zero_bubble_lists(const pipeline_layout& layout, int m,
                                    const schedule_times& times, int bound,
                                    w_placement placement);

} // namespace h2::scheduler
