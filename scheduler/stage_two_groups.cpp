// Stage 2 of a candidate of several groups of replicas (docs/planner.md,
// "Stage 2", "Several groups"): the split of the batch between the groups
// and every group's assignment. Exact when the options are few enough
// (`joint_options`), else a split in proportion to the groups' throughputs,
// rebalanced on the simulated phases.
#include "stage_two_impl.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <set>

namespace h2::scheduler::stage_two_detail {

namespace {

/// Splits between groups tried at most before the split is left to the
/// heuristic.
constexpr std::size_t max_splits = 100000;

/// One search over the splits of the batch between the groups of a
/// candidate. Holds references to `impl` and the candidate.
class batch_split_search {
public:
  batch_split_search(planner::impl& impl, const pipeline_candidate& c,
                     double bound)
      : planner_(impl), candidate_(c), group_count_(c.groups.size()) {
    unit_.resize(group_count_);
    for (std::size_t i = 0; i < group_count_; ++i)
      unit_[i] = static_cast<int>(c.groups[i].replicas.size());
    const int replicas = std::accumulate(unit_.begin(), unit_.end(), 0);
    for (std::size_t i = 0; i < group_count_; ++i)
      searches_.push_back(
        std::make_unique<group_search>(impl, c.groups[i], false, replicas));
    best_.step_seconds = bound;
  }

  stage_two_result run() {
    bool truncated = false;
    const auto splits = all_splits(truncated);
    if (splits.empty()) {
      stage_two_result none;
      none.proven_optimal = true;
      return none;
    }
    std::size_t nodes = 0;
    if (!truncated && exact_option_count(splits) <=
                        static_cast<double>(planner_.options.joint_options)) {
      search_exactly(splits);
    } else {
      best_.proven_optimal = false;
      split_by_throughput(nodes);
    }
    best_.nodes = nodes;
    return std::move(best_);
  }

private:
  /// Every split: sequences per group a positive multiple of its unit,
  /// summing to the batch. Sets `truncated` beyond max_splits.
  std::vector<std::vector<int>> all_splits(bool& truncated) const {
    std::vector<std::vector<int>> splits;
    std::vector<int> split(group_count_);
    // Calls, not only splits, are bounded: most branches of a large batch
    // over several groups end without a split.
    std::size_t calls = 0;
    std::function<void(std::size_t, int)> rec = [&](std::size_t i, int left) {
      if (splits.size() > max_splits || ++calls > 64 * max_splits) {
        truncated = true;
        return;
      }
      if (i + 1 == group_count_) {
        if (left >= unit_[i] && left % unit_[i] == 0) {
          split[i] = left;
          splits.push_back(split);
        }
        return;
      }
      // Stops at the limit: the loops above it would otherwise run on,
      // O(batch^(groups - 1)) calls each returning at once.
      for (int x = unit_[i]; x <= left && !truncated; x += unit_[i]) {
        split[i] = x;
        rec(i + 1, left - x);
      }
    };
    rec(0, planner_.sequences());
    return splits;
  }

  /// The size of the exact enumeration: for every (group, sequences per
  /// replica), its partitions times its micro-batch sizes.
  double exact_option_count(const std::vector<std::vector<int>>& splits) const {
    double count = 0;
    std::vector<std::set<int>> sequences(group_count_);
    for (const auto& split : splits)
      for (std::size_t i = 0; i < group_count_; ++i)
        sequences[i].insert(split[i] / unit_[i]);
    for (std::size_t i = 0; i < group_count_; ++i)
      for (int seqs : sequences[i])
        count += binomial(planner_.layers() - 1, searches_[i]->stages() - 1) *
                 static_cast<double>(planner_.micro_batch_sizes(seqs).size());
    return count;
  }

  /// Simulates the plan of `split` with group i taking `sols[i]`; keeps it
  /// when it fits and beats the best.
  void consider(const std::vector<int>& split,
                const std::vector<const group_solution*>& sols) {
    plan p;
    p.schedule = planner_.pipeline_schedule;
    p.zero1 = planner_.job->plan.zero1;
    for (std::size_t i = 0; i < group_count_; ++i)
      add_replicas(planner_, candidate_.groups[i], *searches_[i], *sols[i],
                   split[i] / unit_[i], p);
    auto s = planner_.simulate_plan(p, false);
    if (s.fits && s.step_seconds < best_.step_seconds) {
      best_.feasible = true;
      best_.step_seconds = s.step_seconds;
      best_.value = std::move(p);
    }
  }

  /// Exact: all options of every group per sequences per replica, sorted
  /// by a lower bound of any step they are in (joint_option_bound()).
  void search_exactly(const std::vector<std::vector<int>>& splits) {
    const int replicas_total = candidate_.replicas();
    const double wire_ratio =
      planner_.job->transport.reduce_dtype == dtype::fp32 ? 1.0 : 0.5;
    const auto inbound = inbound_links(planner_, candidate_);
    auto bound_of = [&](std::size_t i, const group_solution& sol) {
      return joint_option_bound(planner_.pipeline_schedule, inbound[i],
                                replicas_total, wire_ratio, sol);
    };
    // (group, sequences per replica) -> options, by bound.
    std::map<std::pair<std::size_t, int>, std::vector<group_solution>> options;
    for (const auto& split : splits)
      for (std::size_t i = 0; i < group_count_; ++i) {
        const int seqs = split[i] / unit_[i];
        auto key = std::make_pair(i, seqs);
        if (options.count(key) != 0)
          continue;
        auto& list = options[key];
        for (int micro_batch_size : planner_.micro_batch_sizes(seqs)) {
          searches_[i]->setup(micro_batch_size, seqs);
          searches_[i]->enumerate([&](const std::vector<int>& ends) {
            auto sol = searches_[i]->evaluate(ends);
            if (std::isfinite(sol.step))
              list.push_back(sol);
          });
        }
        std::sort(list.begin(), list.end(), [&](const auto& a, const auto& b) {
          return bound_of(i, a) < bound_of(i, b);
        });
      }
    std::vector<const group_solution*> picks(group_count_);
    // Combinations simulated at most (beyond: not proven optimal).
    const std::size_t max_simulated = 20 * planner_.options.joint_options;
    std::size_t simulated = 0;
    for (const auto& split : splits) {
      std::function<void(std::size_t, double)> rec = [&](std::size_t i,
                                                         double bound) {
        if (i == group_count_) {
          if (++simulated <= max_simulated)
            consider(split, picks);
          return;
        }
        for (const auto& sol : options[{i, split[i] / unit_[i]}]) {
          double v = std::max(bound, bound_of(i, sol));
          if (v >= best_.step_seconds || simulated > max_simulated)
            break; // sorted: every later option is no better
          picks[i] = &sol;
          rec(i + 1, v);
        }
      };
      rec(0, 0.0);
    }
    best_.proven_optimal = simulated <= max_simulated;
  }

  /// Heuristic: split in proportion to each group's throughput, solve,
  /// rebalance on the simulated phases, a few rounds. Adds the
  /// branch-and-bound nodes spent to `nodes`.
  void split_by_throughput(std::size_t& nodes) {
    std::vector<double> weight(group_count_);
    for (std::size_t i = 0; i < group_count_; ++i) {
      double speed = 0;
      for (int chip : candidate_.groups[i].replicas.front()) {
        const auto& coefficients = planner_.costs.coefficients(
          *planner_.chips[static_cast<std::size_t>(chip)], 1);
        double t = coefficients.block.forward_seconds +
                   coefficients.block.backward_seconds;
        speed += t > 0 ? 1.0 / t : 0.0;
      }
      weight[i] = speed * unit_[i];
    }
    std::vector<std::vector<int>> tried;
    for (int round = 0; round < 4; ++round) {
      auto split = proportional_split(planner_.sequences(), unit_, weight);
      if (split.empty() ||
          std::find(tried.begin(), tried.end(), split) != tried.end())
        break;
      tried.push_back(split);
      std::vector<group_solution> sols(group_count_);
      std::vector<const group_solution*> picks(group_count_);
      bool ok = true;
      for (std::size_t i = 0; i < group_count_ && ok; ++i) {
        bool proven = true;
        sols[i] = solve_group(planner_, *searches_[i], split[i] / unit_[i], inf,
                              proven, nodes);
        ok = std::isfinite(sols[i].step);
        picks[i] = &sols[i];
      }
      if (!ok)
        break;
      consider(split, picks);
      // Throughput of each group at its share: sequences per phase second.
      for (std::size_t i = 0; i < group_count_; ++i)
        weight[i] = split[i] / std::max(sols[i].phase, 1e-300);
    }
  }

  planner::impl& planner_;
  const pipeline_candidate& candidate_;
  std::size_t group_count_;
  /// Per group: its replicas; its sequences come in multiples of it.
  std::vector<int> unit_;
  std::vector<std::unique_ptr<group_search>> searches_; ///< per group
  stage_two_result best_;
};

} // namespace

std::vector<int> proportional_split(int total, const std::vector<int>& unit,
                                    const std::vector<double>& weight) {
  const std::size_t group_count = unit.size();
  std::vector<int> sequences(group_count);
  double weight_sum = std::accumulate(weight.begin(), weight.end(), 0.0);
  auto share_of = [&](std::size_t i) {
    return weight_sum > 0 ? total * weight[i] / weight_sum
                          : total / double(group_count);
  };
  int sum = 0;
  for (std::size_t i = 0; i < group_count; ++i) {
    sequences[i] = std::max(
      unit[i], static_cast<int>(std::floor(share_of(i) / unit[i])) * unit[i]);
    sum += sequences[i];
  }
  // Fix the sum one unit at a time: add where the share is most short,
  // remove where it is most over.
  for (int guard = 0; sum != total && guard < 4 * total; ++guard) {
    std::size_t pick = group_count;
    double score = -inf;
    for (std::size_t i = 0; i < group_count; ++i) {
      const double share = share_of(i);
      if (sum < total) {
        if (sum + unit[i] > total)
          continue;
        double s = share - sequences[i];
        if (s > score)
          score = s, pick = i;
      } else {
        if (sequences[i] - unit[i] < unit[i])
          continue;
        double s = sequences[i] - share;
        if (s > score)
          score = s, pick = i;
      }
    }
    if (pick == group_count)
      return {};
    int change = sum < total ? unit[pick] : -unit[pick];
    sequences[pick] += change;
    sum += change;
  }
  if (sum != total)
    return {};
  return sequences;
}

stage_two_result solve_groups(planner::impl& impl, const pipeline_candidate& c,
                              double bound) {
  return batch_split_search(impl, c, bound).run();
}

} // namespace h2::scheduler::stage_two_detail
