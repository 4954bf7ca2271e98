// Stage 2's incumbent for one group (docs/planner.md, "Stage 2"): the
// bottleneck-balancing heuristic, improved by a local search that moves
// blocks between runs of stages by simulation. Branch and bound starts from
// it, so a good incumbent prunes early.
#include "stage_two_impl.hpp"

#include <algorithm>
#include <cmath>

namespace h2::scheduler::stage_two_detail {

group_solution group_search::heuristic() {
  const auto stage_count = static_cast<std::size_t>(stages_);
  if (stages_ == 1)
    return evaluate({layers_});
  // Per stage: the fewest and the most blocks that fit, and F + B per block
  // count from the fewest.
  std::vector<int> min_blocks(stage_count), max_blocks(stage_count);
  std::vector<std::vector<double>> load(stage_count);
  std::vector<double> loads;
  int min_total = 0;
  for (int s = 0; s < stages_; ++s) {
    const auto i = static_cast<std::size_t>(s);
    min_blocks[i] = (s == 0 || s == stages_ - 1) ? 0 : 1;
    min_total += min_blocks[i];
    max_blocks[i] = min_blocks[i] - 1;
    for (int k = min_blocks[i]; k <= blocks_; ++k) {
      auto v = eval(s, layers_with(s, k));
      if (!v.ok)
        break;
      max_blocks[i] = k;
      load[i].push_back(v.forward + v.backward);
      loads.push_back(v.forward + v.backward);
    }
    if (max_blocks[i] < min_blocks[i])
      return {};
  }
  if (min_total > blocks_)
    return {};
  std::sort(loads.begin(), loads.end());
  // Blocks in all when every stage takes the most whose load is at most
  // `tau`; -1 when a stage cannot meet it.
  auto count_at = [&](double tau, std::vector<int>* blocks) {
    int total = 0;
    for (std::size_t i = 0; i < stage_count; ++i) {
      const auto& l = load[i];
      auto it = std::upper_bound(l.begin(), l.end(), tau);
      int k = min_blocks[i] + static_cast<int>(it - l.begin()) - 1;
      if (k < min_blocks[i])
        return -1;
      if (blocks != nullptr)
        (*blocks)[i] = k;
      total += k;
    }
    return total;
  };
  std::size_t lo = 0, hi = loads.size();
  while (lo < hi) { // the smallest load with enough room
    std::size_t mid = (lo + hi) / 2;
    if (count_at(loads[mid], nullptr) >= blocks_)
      hi = mid;
    else
      lo = mid + 1;
  }
  if (lo == loads.size())
    return {};
  std::vector<int> blocks(stage_count);
  int total = count_at(loads[lo], &blocks);
  while (total > blocks_) {
    std::size_t worst = stage_count;
    for (std::size_t i = 0; i < stage_count; ++i)
      if (blocks[i] > min_blocks[i] &&
          (worst == stage_count ||
           load[i][static_cast<std::size_t>(blocks[i] - min_blocks[i])] >
             load[worst]
                 [static_cast<std::size_t>(blocks[worst] - min_blocks[worst])]))
        worst = i;
    --blocks[worst];
    --total;
  }
  group_solution best = evaluate(ends_of(blocks));
  if (!std::isfinite(best.step))
    return best;
  local_search(blocks, min_blocks, max_blocks, best);
  return best;
}

/// Moves one block at a time between units (runs of consecutive stages
/// of one chip class and role), best improvement first, while the
/// simulated step improves.
void group_search::local_search(std::vector<int>& blocks,
                                const std::vector<int>& min_blocks,
                                const std::vector<int>& max_blocks,
                                group_solution& best) {
  const auto stage_count = static_cast<std::size_t>(stages_);
  std::vector<std::pair<int, int>> units; // [first, end) positions
  for (int s = 0; s < stages_;) {
    int e = s + 1;
    auto class_of = [&](int i) {
      return planner_.chip_class[static_cast<std::size_t>(
        std::find(planner_.chips.begin(), planner_.chips.end(),
                  chips_[0][static_cast<std::size_t>(i)]) -
        planner_.chips.begin())];
    };
    if (s != 0)
      while (e < stages_ - 1 && class_of(e) == class_of(s))
        ++e;
    units.emplace_back(s, e);
    s = e;
  }
  // A stage's compute per micro-batch with `blocks`.
  auto load = [&](std::size_t s) {
    auto v =
      eval(static_cast<int>(s), layers_with(static_cast<int>(s), blocks[s]));
    return v.ok ? v.forward + v.backward : 0.0;
  };
  const int iterations = 2 * layers_;
  for (int it = 0; it < iterations; ++it) {
    group_solution step_best = best;
    std::vector<int> blocks_best;
    // Blocks leave the three busiest units only: a move from elsewhere
    // adds to a stage that already waits on busier ones (on every example
    // the plans equal those of trying every pair, and on 10,000 chips of
    // eight kinds the search is 4x faster).
    std::vector<std::pair<double, std::size_t>> busy;
    for (std::size_t u = 0; u < units.size(); ++u) {
      double most = 0;
      for (int i = units[u].first; i < units[u].second; ++i)
        most = std::max(most, load(static_cast<std::size_t>(i)));
      busy.emplace_back(most, u);
    }
    std::sort(busy.rbegin(), busy.rend());
    busy.resize(std::min<std::size_t>(busy.size(), 3));
    for (const auto& [most, u] : busy)
      for (const auto& [to_first, to_end] : units) {
        const auto [from_first, from_end] = units[u];
        if (from_first == to_first)
          continue;
        // Take from the fullest stage of one unit (earliest), give to the
        // emptiest of the other (latest): units stay even.
        std::size_t from = stage_count, to = stage_count;
        for (int i = from_first; i < from_end; ++i) {
          auto x = static_cast<std::size_t>(i);
          if (blocks[x] > min_blocks[x] &&
              (from == stage_count || blocks[x] > blocks[from]))
            from = x;
        }
        for (int i = to_first; i < to_end; ++i) {
          auto x = static_cast<std::size_t>(i);
          if (blocks[x] < max_blocks[x] &&
              (to == stage_count || blocks[x] <= blocks[to]))
            to = x;
        }
        if (from == stage_count || to == stage_count)
          continue;
        --blocks[from];
        ++blocks[to];
        auto sol = evaluate(ends_of(blocks));
        if (sol.step < step_best.step) {
          step_best = sol;
          blocks_best = blocks;
        }
        ++blocks[from];
        --blocks[to];
      }
    if (blocks_best.empty())
      return;
    best = step_best;
    blocks = blocks_best;
  }
}

} // namespace h2::scheduler::stage_two_detail
