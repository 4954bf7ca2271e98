#include "h2/scheduler/schedule.hpp"

#include "schedule_greedy.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <ostream>

namespace h2::scheduler {

namespace {

using lists = std::vector<std::vector<op>>;

void check_micro_batches(int micro_batches) {
  H2_ENFORCE(micro_batches >= 1, "micro_batches = ", micro_batches);
}

/// The compute ops of a chip, appended in order.
struct compute_list {
  std::vector<op>& out;
  int chunk;

  void forward(int mb) { out.push_back({op_kind::forward, mb, chunk}); }
  void backward(int mb) { out.push_back({op_kind::backward, mb, chunk}); }
};

// ---- One function per schedule: the compute-only lists of every chip. ----

lists gpipe_lists(const pipeline_layout& layout, int m) {
  lists out(static_cast<std::size_t>(layout.chips));
  for (int s = 0; s < layout.chips; ++s) {
    compute_list c{out[static_cast<std::size_t>(s)], s};
    for (int i = 0; i < m; ++i)
      c.forward(i);
    for (int i = 0; i < m; ++i)
      c.backward(i);
  }
  return out;
}

/// 1F1B's order of chip s: `warmup` forwards, then one forward / one
/// backward, then the remaining backwards. `backward` names the op that
/// carries the input gradients (fused, or B).
std::vector<op> one_f_one_b_order(int s, int chips, int m, op_kind backward) {
  std::vector<op> out;
  const int warmup = std::min(chips - s - 1, m);
  int fwd = 0;
  int bwd = 0;
  while (fwd < warmup)
    out.push_back({op_kind::forward, fwd++, s});
  while (fwd < m) {
    out.push_back({op_kind::forward, fwd++, s});
    out.push_back({backward, bwd++, s});
  }
  while (bwd < m)
    out.push_back({backward, bwd++, s});
  return out;
}

lists one_f_one_b_lists(const pipeline_layout& layout, int m) {
  // The first backward reaches chip s only after the last chip has
  // forwarded micro-batch 0, i.e. after chip s forwarded chips - s
  // micro-batches. The warm-up fills that window; the steady state then
  // trades one forward for one backward, so at most chips - s activations
  // are held at once.
  lists out;
  for (int s = 0; s < layout.chips; ++s)
    out.push_back(one_f_one_b_order(s, layout.chips, m, op_kind::backward));
  return out;
}

/// The micro-batch groups of interleaved 1F1B: max(1, m / p) rounds of
/// sizes that differ by at most one, larger first, each at least p.
std::vector<int> interleaved_groups(int chips, int m) {
  const int rounds = std::max(1, m / chips);
  std::vector<int> out(static_cast<std::size_t>(rounds), m / rounds);
  for (int r = 0; r < m % rounds; ++r)
    ++out[static_cast<std::size_t>(r)];
  return out;
}

int interleaved_warmup(int chips, int chip, int v, int m) {
  const int group = interleaved_groups(chips, m).front();
  return std::min((chips - chip - 1) * 2 + (v - 1) * group, v * m);
}

lists interleaved_lists(const pipeline_layout& layout, int m) {
  const int p = layout.chips;
  const int v = layout.chunks() / p;
  // Megatron-LM's schedule table: micro-batches in groups, each group
  // through chunk 0, 1, ..., v - 1 of the chip; backwards walk the same
  // table with the chunks reversed. Groups of p when p divides m; else
  // (the flexible form, as torch.distributed.pipelining's) m / p rounds of
  // nearly equal groups, each larger than p.
  std::vector<std::pair<int, int>> table; // (micro-batch, local chunk)
  int first = 0;
  for (int group : interleaved_groups(p, m)) {
    for (int j = 0; j < v; ++j)
      for (int i = first; i < first + group; ++i)
        table.emplace_back(i, j);
    first += group;
  }
  lists out(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& list = out[static_cast<std::size_t>(s)];
    auto forward = [&](std::size_t k) {
      list.push_back(
        {op_kind::forward, table[k].first, table[k].second * p + s});
    };
    auto backward = [&](std::size_t k) {
      list.push_back(
        {op_kind::backward, table[k].first, (v - 1 - table[k].second) * p + s});
    };
    const auto total = table.size();
    const auto warmup =
      static_cast<std::size_t>(interleaved_warmup(p, s, v, m));
    std::size_t fwd = 0;
    std::size_t bwd = 0;
    while (fwd < warmup)
      forward(fwd++);
    while (fwd < total) {
      forward(fwd++);
      backward(bwd++);
    }
    while (bwd < total)
      backward(bwd++);
  }
  return out;
}

/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B's
/// order of forwards and B; each chip's W are deferred and run where the
/// chip would wait for a neighbour, as far as they fit the wait, else
/// before a forward that would hold more than min(chips, m) micro-batches,
/// else at the end. Where the waits fall is predicted by running the lists
/// with `times` (equal times when empty: the paper's ZB-H1; each chip's own
/// times: zb-hetero, whose W fill the waits a slower neighbour causes).
lists zb_h1_lists(const pipeline_layout& layout, int m,
                  const schedule_times& times) {
  const int p = layout.chips;
  const auto time_of = [&](const std::vector<double>& v, int s) {
    return v.empty() ? 1.0 : v[static_cast<std::size_t>(s)];
  };
  const int bound = std::min(p, m);
  struct chip_state {
    std::vector<op> order; // forwards and B, 1F1B's order
    std::size_t next = 0;
    double clock = 0;
    int held = 0;             // forwarded, W not done
    std::vector<int> pending; // B done, W not done, oldest first
    std::size_t pending_first = 0;
  };
  std::vector<chip_state> chips(static_cast<std::size_t>(p));
  // Completion times of forwards and B per (chip, micro-batch); < 0: not yet.
  std::vector<double> forwarded(static_cast<std::size_t>(p * m), -1);
  std::vector<double> input_done(static_cast<std::size_t>(p * m), -1);
  lists out(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s)
    chips[static_cast<std::size_t>(s)].order =
      one_f_one_b_order(s, p, m, op_kind::backward_input);
  auto run_w = [&](int s, chip_state& c) {
    const int mb = c.pending[c.pending_first++];
    out[static_cast<std::size_t>(s)].push_back(
      {op_kind::backward_weight, mb, s});
    c.clock += time_of(times.weight, s);
    --c.held;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      auto& c = chips[static_cast<std::size_t>(s)];
      while (c.next < c.order.size()) {
        const op x = c.order[c.next];
        const bool fwd = x.kind == op_kind::forward;
        if (fwd && c.held == bound) {
          run_w(s, c); // memory first: the oldest W frees a micro-batch
          progress = true;
          continue;
        }
        // When the input (activations or gradients) is there.
        double ready = 0;
        if (fwd && s > 0)
          ready =
            forwarded[static_cast<std::size_t>((s - 1) * m + x.micro_batch)];
        if (!fwd && s + 1 < p)
          ready =
            input_done[static_cast<std::size_t>((s + 1) * m + x.micro_batch)];
        if (ready < 0)
          break; // the neighbour has not got there yet
        // A W that fits the wait; a relative hair of slack so that times
        // summed in another order (the runtime's, the planner's) place W
        // alike.
        while (c.pending_first < c.pending.size() &&
               c.clock + time_of(times.weight, s) <= ready * (1 + 1e-12))
          run_w(s, c);
        c.clock = std::max(c.clock, ready);
        out[static_cast<std::size_t>(s)].push_back(x);
        const auto at = static_cast<std::size_t>(s * m + x.micro_batch);
        if (fwd) {
          c.clock += time_of(times.forward, s);
          forwarded[at] = c.clock;
          ++c.held;
        } else {
          c.clock += time_of(times.input, s);
          input_done[at] = c.clock;
          c.pending.push_back(x.micro_batch);
        }
        ++c.next;
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    auto& c = chips[static_cast<std::size_t>(s)];
    H2_ENFORCE(c.next == c.order.size(), "zb-h1 generation stuck on chip ", s);
    while (c.pending_first < c.pending.size())
      run_w(s, c);
  }
  return out;
}

/// 1F1B's order with every W right after its B: the eager placement.
lists eager_w_lists(const pipeline_layout& layout, int m) {
  lists out;
  for (int s = 0; s < layout.chips; ++s) {
    auto& list = out.emplace_back();
    for (const op& x :
         one_f_one_b_order(s, layout.chips, m, op_kind::backward_input)) {
      list.push_back(x);
      if (x.kind == op_kind::backward_input)
        list.push_back({op_kind::backward_weight, x.micro_batch, s});
    }
  }
  return out;
}

/// The step of compute-only lists of one chunk per chip under `times`, links
/// free: a forward waits for the previous chip's, a B for the next chip's.
double predicted_step(const lists& compute, int m, const schedule_times& t) {
  const auto p = compute.size();
  std::vector<double> clock(p, 0),
    forwarded(p * static_cast<std::size_t>(m), -1),
    input_done(forwarded.size(), -1);
  std::vector<std::size_t> next(p, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t s = 0; s < p; ++s)
      for (; next[s] < compute[s].size(); ++next[s], moved = true) {
        const op& x = compute[s][next[s]];
        const auto mb = static_cast<std::size_t>(x.micro_batch);
        const auto at = s * static_cast<std::size_t>(m) + mb;
        if (x.kind == op_kind::forward) {
          const double ready =
            s > 0 ? forwarded[at - static_cast<std::size_t>(m)] : 0;
          if (ready < 0)
            break;
          clock[s] = std::max(clock[s], ready) + t.forward[s];
          forwarded[at] = clock[s];
        } else if (x.kind == op_kind::backward_input) {
          const double ready =
            s + 1 < p ? input_done[at + static_cast<std::size_t>(m)] : 0;
          if (ready < 0)
            break;
          clock[s] = std::max(clock[s], ready) + t.input[s];
          input_done[at] = clock[s];
        } else {
          clock[s] += t.weight[s];
        }
      }
  }
  return *std::max_element(clock.begin(), clock.end());
}

/// zb-hetero: of the W placements this file knows (ZB-H1's, placed with
/// equal times; placed with `times`; every W right after its B), the one
/// whose step under `times` is shortest. Ties keep the earlier.
lists zb_hetero_lists(const pipeline_layout& layout, int m,
                      const schedule_times& times) {
  if (!layout.one_chunk_per_chip()) {
    // Chips of several chunks, uneven too: the fastest greedy run.
    greedy_run best;
    best.step = -1;
    for (auto w : {w_placement::fill, w_placement::eager, w_placement::last}) {
      auto run = greedy_zero_bubble_lists(layout, m, times,
                                          std::min(layout.chips, m), w);
      if (best.step < 0 || run.step < best.step * (1 - 1e-12))
        best = std::move(run);
    }
    return best.lists;
  }
  if (times.forward.empty())
    return zb_h1_lists(layout, m, {});
  lists best = zb_h1_lists(layout, m, {});
  double best_step = predicted_step(best, m, times);
  for (auto candidate :
       {zb_h1_lists(layout, m, times), eager_w_lists(layout, m)}) {
    const double step = predicted_step(candidate, m, times);
    if (step < best_step * (1 - 1e-12)) {
      best_step = step;
      best = std::move(candidate);
    }
  }
  return best;
}

lists compute_lists(schedule_kind kind, const pipeline_layout& layout, int m,
                    const schedule_times& times) {
  switch (kind) {
    case schedule_kind::gpipe:
      return gpipe_lists(layout, m);
    case schedule_kind::one_f_one_b:
      return one_f_one_b_lists(layout, m);
    case schedule_kind::interleaved_1f1b:
      return interleaved_lists(layout, m);
    case schedule_kind::zb_h1:
      return zb_h1_lists(layout, m, {}); // the paper's: equal times
    case schedule_kind::zb_hetero:
      return zb_hetero_lists(layout, m, times);
  }
  // No default above, so -Wswitch names a new enumerator left unhandled.
  H2_ENFORCE(false, "unknown schedule_kind ", static_cast<int>(kind));
  return {};
}

/// The one place communication is derived: receives before and sends after
/// the compute ops whose neighbouring chunk lives on another chip.
lists with_communication(const lists& compute, const pipeline_layout& layout) {
  const int last = layout.chunks() - 1;
  auto elsewhere = [&](int chunk, int neighbour) {
    return neighbour >= 0 && neighbour <= last &&
           layout.chunk_chip[static_cast<std::size_t>(neighbour)] !=
             layout.chunk_chip[static_cast<std::size_t>(chunk)];
  };
  lists out(compute.size());
  for (std::size_t k = 0; k < compute.size(); ++k) {
    auto& list = out[k];
    list.reserve(3 * compute[k].size());
    for (const op& x : compute[k]) {
      const int c = x.chunk;
      const int mb = x.micro_batch;
      switch (x.kind) {
        case op_kind::forward:
          if (elsewhere(c, c - 1))
            list.push_back({op_kind::recv_forward, mb, c});
          list.push_back(x);
          if (elsewhere(c, c + 1))
            list.push_back({op_kind::send_forward, mb, c});
          break;
        case op_kind::backward:
        case op_kind::backward_input:
          if (elsewhere(c, c + 1))
            list.push_back({op_kind::recv_backward, mb, c});
          list.push_back(x);
          if (elsewhere(c, c - 1))
            list.push_back({op_kind::send_backward, mb, c});
          break;
        case op_kind::backward_weight:
          list.push_back(x);
          break;
        case op_kind::recv_forward:
        case op_kind::send_forward:
        case op_kind::recv_backward:
        case op_kind::send_backward:
          H2_ENFORCE(false, "a generator emitted ", x);
      }
    }
  }
  return out;
}

} // namespace

std::string_view to_string(op_kind k) noexcept {
  switch (k) {
    case op_kind::recv_forward:
      return "recv_forward";
    case op_kind::forward:
      return "forward";
    case op_kind::send_forward:
      return "send_forward";
    case op_kind::recv_backward:
      return "recv_backward";
    case op_kind::backward:
      return "backward";
    case op_kind::send_backward:
      return "send_backward";
    case op_kind::backward_input:
      return "backward_input";
    case op_kind::backward_weight:
      return "backward_weight";
  }
  return "unknown";
}

bool is_compute(op_kind k) noexcept {
  switch (k) {
    case op_kind::forward:
    case op_kind::backward:
    case op_kind::backward_input:
    case op_kind::backward_weight:
      return true;
    case op_kind::recv_forward:
    case op_kind::send_forward:
    case op_kind::recv_backward:
    case op_kind::send_backward:
      return false;
  }
  return false;
}

std::ostream& operator<<(std::ostream& out, const op& x) {
  out << to_string(x.kind) << '(';
  if (x.chunk != 0)
    out << 'c' << x.chunk << ", ";
  return out << x.micro_batch << ')';
}

int pipeline_layout::chunks_of(int chip) const noexcept {
  return static_cast<int>(
    std::count(chunk_chip.begin(), chunk_chip.end(), chip));
}

bool pipeline_layout::one_chunk_per_chip() const noexcept {
  if (chunks() != chips)
    return false;
  for (int c = 0; c < chips; ++c)
    if (chunk_chip[static_cast<std::size_t>(c)] != c)
      return false;
  return true;
}

pipeline_layout pipeline_layout::one_per_chip(int chips) {
  H2_ENFORCE(chips >= 1, "chips = ", chips);
  pipeline_layout out{chips, {}};
  for (int c = 0; c < chips; ++c)
    out.chunk_chip.push_back(c);
  return out;
}

pipeline_layout pipeline_layout::dealt(const std::vector<int>& counts) {
  H2_ENFORCE(!counts.empty(), "no chips");
  int rounds = 0;
  for (int n : counts) {
    H2_ENFORCE(n >= 1, "a chip with ", n, " chunks");
    rounds = std::max(rounds, n);
  }
  pipeline_layout out{static_cast<int>(counts.size()), {}};
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < counts.size(); ++k)
      if (counts[k] > r)
        out.chunk_chip.push_back(static_cast<int>(k));
  return out;
}

std::string layout_problem(schedule_kind kind, const pipeline_layout& layout,
                           int micro_batches) {
  if (layout.chips < 1)
    return "a pipeline needs at least one chip";
  for (int chip : layout.chunk_chip)
    if (chip < 0 || chip >= layout.chips)
      return detail::concat("a chunk on chip ", chip, " of a ", layout.chips,
                            "-chip pipeline");
  switch (kind) {
    case schedule_kind::zb_hetero: // any layout (schedule_greedy.hpp)
      return "";
    case schedule_kind::gpipe:
    case schedule_kind::one_f_one_b:
    case schedule_kind::zb_h1:
      if (!layout.one_chunk_per_chip())
        return detail::concat(to_string(kind),
                              " runs one chunk per chip; use "
                              "interleaved-1f1b or zb-hetero for several");
      return "";
    case schedule_kind::interleaved_1f1b: {
      const int v = layout.chunks() / layout.chips;
      std::vector<int> counts(static_cast<std::size_t>(layout.chips), v);
      if (v < 2 || layout != pipeline_layout::dealt(counts))
        return "interleaved-1f1b needs every chip to hold the same number "
               "(at least 2) of chunks, dealt round by round";
      if (micro_batches < layout.chips)
        return detail::concat("interleaved-1f1b needs at least as many "
                              "micro-batches as chips (",
                              micro_batches, " < ", layout.chips, ")");
      return "";
    }
  }
  return detail::concat("unknown schedule_kind ", static_cast<int>(kind));
}

schedule make_schedule(schedule_kind kind, const pipeline_layout& layout,
                       int micro_batches, const schedule_times& times) {
  check_micro_batches(micro_batches);
  const auto problem = layout_problem(kind, layout, micro_batches);
  H2_ENFORCE(problem.empty(), problem);
  for (const auto* v : {&times.forward, &times.input, &times.weight})
    H2_ENFORCE(v->empty() || v->size() == layout.chunk_chip.size(),
               "schedule_times for ", v->size(), " chunks, the layout has ",
               layout.chunks());
  schedule out{kind, layout, micro_batches, {}, false};
  out.ops = with_communication(
    compute_lists(kind, layout, micro_batches, times), layout);
  return out;
}

schedule make_schedule(schedule_kind kind, int chips, int micro_batches) {
  return make_schedule(kind, pipeline_layout::one_per_chip(chips),
                       micro_batches);
}

schedule make_forward_schedule(const pipeline_layout& layout,
                               int micro_batches) {
  check_micro_batches(micro_batches);
  H2_ENFORCE(layout.chips >= 1, "chips = ", layout.chips);
  lists compute(static_cast<std::size_t>(layout.chips));
  // Micro-batch by micro-batch, each through the chip's chunks in order:
  // a chip's later chunk of micro-batch i waits only for earlier chunks.
  for (int i = 0; i < micro_batches; ++i)
    for (int c = 0; c < layout.chunks(); ++c)
      compute[static_cast<std::size_t>(
                layout.chunk_chip[static_cast<std::size_t>(c)])]
        .push_back({op_kind::forward, i, c});
  schedule out{schedule_kind::gpipe, layout, micro_batches, {}, true};
  out.ops = with_communication(compute, layout);
  return out;
}

schedule make_forward_schedule(int chips, int micro_batches) {
  return make_forward_schedule(pipeline_layout::one_per_chip(chips),
                               micro_batches);
}

int in_flight_bound(schedule_kind kind, const pipeline_layout& layout, int chip,
                    int micro_batches) {
  check_micro_batches(micro_batches);
  const int p = layout.chips;
  H2_ENFORCE(p >= 1 && chip >= 0 && chip < p, "chip = ", chip, ", chips = ", p);
  switch (kind) {
    case schedule_kind::gpipe:
      return micro_batches * layout.chunks_of(chip);
    case schedule_kind::one_f_one_b:
      return std::min(p - chip, micro_batches);
    case schedule_kind::interleaved_1f1b: {
      const int v = layout.chunks_of(chip);
      return std::min(interleaved_warmup(p, chip, v, micro_batches) + 1,
                      v * micro_batches);
    }
    case schedule_kind::zb_h1:
      return std::min(p, micro_batches);
    case schedule_kind::zb_hetero: // min(p, m) per chunk
      return layout.chunks_of(chip) * std::min(p, micro_batches);
  }
  H2_ENFORCE(false, "unknown schedule_kind ", static_cast<int>(kind));
  return 0; // unreachable: H2_ENFORCE(false) throws
}

int in_flight_bound(schedule_kind kind, int chips, int chip,
                    int micro_batches) {
  H2_ENFORCE(chips >= 1, "chips = ", chips);
  return in_flight_bound(kind, pipeline_layout::one_per_chip(chips), chip,
                         micro_batches);
}

double theoretical_bubble(schedule_kind kind, int chips, int micro_batches,
                          int chunks_per_chip) {
  H2_ENFORCE(chips >= 1 && micro_batches >= 1 && chunks_per_chip >= 1,
             "chips = ", chips, ", micro_batches = ", micro_batches,
             ", chunks_per_chip = ", chunks_per_chip);
  const double p = chips, m = micro_batches, v = chunks_per_chip;
  switch (kind) {
    case schedule_kind::gpipe:
    case schedule_kind::one_f_one_b:
      return (p - 1) / (m + p - 1);
    case schedule_kind::interleaved_1f1b:
      return (p - 1) / (v * m + p - 1);
    case schedule_kind::zb_h1:
    case schedule_kind::zb_hetero: // equal times: zb-h1's lists
      return (p - 1) / (3 * m + p - 1);
  }
  H2_ENFORCE(false, "unknown schedule_kind ", static_cast<int>(kind));
  return 0;
}

bool splits_backward(schedule_kind kind) noexcept {
  switch (kind) {
    case schedule_kind::gpipe:
    case schedule_kind::one_f_one_b:
    case schedule_kind::interleaved_1f1b:
      return false;
    case schedule_kind::zb_h1:
    case schedule_kind::zb_hetero:
      return true;
  }
  return false;
}

} // namespace h2::scheduler
