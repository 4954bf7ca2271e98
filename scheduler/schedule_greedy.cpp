// zb-hetero on chips holding different numbers of chunks (docs/planner.md,
// "Schedules"): the lists of a greedy run of the step on the chunks' times.
#include "schedule_greedy.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <limits>

namespace h2::scheduler {

namespace {

constexpr double never = std::numeric_limits<double>::infinity();

/// Where the run stands: per chunk, the next micro-batch of each kind and
/// when each forward and B ended (-1: not yet).
struct run_state {
  run_state(int chunks, int m)
      : m(m),
        next_f(static_cast<std::size_t>(chunks)),
        next_b(next_f.size()),
        next_w(next_f.size()),
        f_end(next_f.size() * static_cast<std::size_t>(m), -1),
        b_end(f_end.size(), -1) {}

  int m;
  std::vector<int> next_f, next_b, next_w;
  std::vector<double> f_end, b_end;

  double& f(int c, int mb) { return f_end[index(c, mb)]; }
  double& b(int c, int mb) { return b_end[index(c, mb)]; }
  std::size_t index(int c, int mb) const {
    return static_cast<std::size_t>(c) * static_cast<std::size_t>(m) +
           static_cast<std::size_t>(mb);
  }
};

/// One op a chip could run next, and when it could start.
struct candidate {
  op x{op_kind::forward, 0, 0};
  double start = never;
  double seconds = 0;
};

double time_of(const std::vector<double>& v, int chunk) {
  return v.empty() ? 1.0 : v[static_cast<std::size_t>(chunk)];
}

/// What chip `k` (free at `free`) runs next under the policy of
/// greedy_zero_bubble_lists; start == never when nothing is ready.
candidate choose(const pipeline_layout& layout, int k, double free,
                 run_state& st, const schedule_times& t, int bound,
                 w_placement placement) {
  const int chunks = layout.chunks();
  candidate b, f, w;
  for (int c = 0; c < chunks; ++c) {
    if (layout.chunk_chip[static_cast<std::size_t>(c)] != k)
      continue;
    const int i = st.next_b[static_cast<std::size_t>(c)];
    if (i < st.next_f[static_cast<std::size_t>(c)] &&
        (c + 1 == chunks || st.b(c + 1, i) >= 0)) {
      const double ready =
        std::max(st.f(c, i), c + 1 == chunks ? 0.0 : st.b(c + 1, i));
      const double start = std::max(free, ready);
      if (start < b.start)
        b = {{op_kind::backward_input, i, c}, start, time_of(t.input, c)};
    }
    const int j = st.next_f[static_cast<std::size_t>(c)];
    if (j < st.m && j - st.next_w[static_cast<std::size_t>(c)] < bound &&
        (c == 0 || st.f(c - 1, j) >= 0)) {
      const double start = std::max(free, c == 0 ? 0.0 : st.f(c - 1, j));
      // The earliest; among equals the deeper chunk, which frees memory.
      if (start < f.start || (start == f.start && c > f.x.chunk))
        f = {{op_kind::forward, j, c}, start, time_of(t.forward, c)};
    }
    const int n = st.next_w[static_cast<std::size_t>(c)];
    if (n < st.next_b[static_cast<std::size_t>(c)] && w.start == never)
      w = {{op_kind::backward_weight, n, c},
           std::max(free, st.b(c, n)),
           time_of(t.weight, c)};
  }
  const candidate& first = b.start <= f.start ? b : f;
  if (w.start == never)
    return first;
  if (first.start == never) // nothing else can run
    return w;
  switch (placement) {
    case w_placement::fill:
      return w.start + w.seconds <= first.start * (1 + 1e-12) ? w : first;
    case w_placement::eager:
      return w;
    case w_placement::last:
      return first;
  }
  return first;
}

} // namespace

greedy_run greedy_zero_bubble_lists(const pipeline_layout& layout, int m,
                                    const schedule_times& times, int bound,
                                    w_placement placement) {
  H2_ENFORCE(m >= 1 && bound >= 1, "m=", m, " bound=", bound);
  const int p = layout.chips;
  run_state st(layout.chunks(), m);
  std::vector<double> free(static_cast<std::size_t>(p), 0);
  greedy_run out;
  out.lists.resize(static_cast<std::size_t>(p));
  for (long left = 3L * layout.chunks() * m; left > 0; --left) {
    // The chip whose next op starts first (by chip on ties): every op that
    // starts earlier is already placed, so its choice sees them.
    int chip = -1;
    candidate next;
    for (int k = 0; k < p; ++k) {
      auto c = choose(layout, k, free[static_cast<std::size_t>(k)], st,
                      times, bound, placement);
      if (c.start < next.start) {
        next = c;
        chip = k;
      }
    }
    H2_ENFORCE(chip >= 0, "the greedy zero-bubble run is stuck with ", left,
               " ops left");
    const double end = next.start + next.seconds;
    free[static_cast<std::size_t>(chip)] = end;
    const int c = next.x.chunk, i = next.x.micro_batch;
    switch (next.x.kind) {
      case op_kind::forward:
        st.f(c, i) = end;
        ++st.next_f[static_cast<std::size_t>(c)];
        break;
      case op_kind::backward_input:
        st.b(c, i) = end;
        ++st.next_b[static_cast<std::size_t>(c)];
        break;
      default: // backward_weight
        ++st.next_w[static_cast<std::size_t>(c)];
        break;
    }
    out.lists[static_cast<std::size_t>(chip)].push_back(next.x);
    out.step = std::max(out.step, end);
  }
  return out;
}

} // namespace h2::scheduler
