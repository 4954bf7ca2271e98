// Stage 1 of HeteroAuto: replica layouts and stage orders (docs/planner.md).
#include "planner_impl.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>

namespace h2::scheduler {

namespace {

/// Orders of class subsets: every permutation of every non-empty subset
/// when there are few classes, else a few heuristic orders of all of them.
std::vector<std::vector<int>> class_orders(int classes,
                                           const std::vector<double>& memory,
                                           const std::vector<double>& speed,
                                           bool subsets) {
  std::vector<std::vector<int>> out;
  if (classes <= 5) {
    for (int mask = 1; mask < (1 << classes); ++mask) {
      if (!subsets && mask != (1 << classes) - 1)
        continue;
      std::vector<int> ks;
      for (int k = 0; k < classes; ++k)
        if (mask & (1 << k))
          ks.push_back(k);
      do
        out.push_back(ks);
      while (std::next_permutation(ks.begin(), ks.end()));
    }
    return out;
  }
  std::vector<int> ks(static_cast<std::size_t>(classes));
  std::iota(ks.begin(), ks.end(), 0);
  auto by = [&](const std::vector<double>& key, bool descending) {
    auto v = ks;
    std::stable_sort(v.begin(), v.end(), [&](int a, int b) {
      return descending ? key[static_cast<std::size_t>(a)] >
                            key[static_cast<std::size_t>(b)]
                        : key[static_cast<std::size_t>(a)] <
                            key[static_cast<std::size_t>(b)];
    });
    return v;
  };
  for (auto v : {by(memory, true), by(memory, false), by(speed, true),
                 by(speed, false), ks})
    if (std::find(out.begin(), out.end(), v) == out.end())
      out.push_back(v);
  return out;
}

/// Every set of disjoint ordered chip lists over chips 0..n-1: for every
/// non-empty subset of the chips, every set partition of it, every block
/// in every order.
std::vector<std::vector<std::vector<int>>> all_chip_layouts(int n) {
  std::vector<int> block_of(static_cast<std::size_t>(n), -1);
  // Restricted growth strings over the chosen subset give set partitions;
  // each block is then permuted.
  std::function<void(int, int, const std::vector<int>&)> partitions;
  std::vector<std::vector<std::vector<int>>> layouts;
  partitions = [&](int i, int blocks, const std::vector<int>& subset) {
    if (i == static_cast<int>(subset.size())) {
      std::vector<std::vector<int>> reps(static_cast<std::size_t>(blocks));
      for (std::size_t j = 0; j < subset.size(); ++j)
        reps[static_cast<std::size_t>(block_of[j])].push_back(subset[j]);
      // Every ordering of every replica.
      std::function<void(std::size_t)> permute = [&](std::size_t r) {
        if (r == reps.size()) {
          layouts.push_back(reps);
          return;
        }
        std::sort(reps[r].begin(), reps[r].end());
        do
          permute(r + 1);
        while (std::next_permutation(reps[r].begin(), reps[r].end()));
      };
      permute(0);
      return;
    }
    for (int b = 0; b <= blocks; ++b) {
      block_of[static_cast<std::size_t>(i)] = b;
      partitions(i + 1, std::max(blocks, b + 1), subset);
    }
  };
  for (int mask = 1; mask < (1 << n); ++mask) {
    std::vector<int> subset;
    for (int i = 0; i < n; ++i)
      if (mask & (1 << i))
        subset.push_back(i);
    partitions(0, 0, subset);
  }
  return layouts;
}

} // namespace

double planner::impl::model_static_bytes(int max_replicas) const {
  // Under ZeRO-1 at least 8 bytes per parameter and the moments shared by
  // as many replicas as can be.
  const double per_parameter =
    job->plan.zero1 ? 8.0 + 8.0 / std::max(1, max_replicas) : 16.0;
  double model_static = 0;
  for (int l = 0; l < layers(); ++l)
    model_static +=
      per_parameter * static_cast<double>(layer_parameters(job->model, l));
  return model_static;
}

bool planner::impl::replica_may_fit(const std::vector<int>& replica,
                                    double model_static) const {
  double cap = 0;
  for (int c : replica)
    cap += class_capacity_bytes[static_cast<std::size_t>(
      chip_class[static_cast<std::size_t>(c)])];
  return cap >= model_static;
}

std::vector<pipeline_candidate>
planner::impl::stage_one_exhaustive(int max_replicas,
                                    double model_static) const {
  const int n = static_cast<int>(chips.size());
  std::vector<pipeline_candidate> out;
  // Every set of disjoint ordered chip lists, up to symmetry: chips of one
  // class on one node are interchangeable (same speed, memory, links).
  std::vector<int> sym(static_cast<std::size_t>(n));
  std::map<std::pair<int, int>, int> sym_index;
  for (int i = 0; i < n; ++i) {
    auto key = std::make_pair(chip_class[static_cast<std::size_t>(i)],
                              chips[static_cast<std::size_t>(i)]->id.node);
    sym[static_cast<std::size_t>(i)] =
      sym_index.emplace(key, static_cast<int>(sym_index.size())).first->second;
  }
  std::set<std::vector<std::vector<int>>> seen;
  for (auto& reps : all_chip_layouts(n)) {
    const int r = static_cast<int>(reps.size());
    if (r > max_replicas || r > sequences())
      continue;
    bool ok = true;
    for (const auto& rep : reps)
      ok = ok && static_cast<int>(rep.size()) <= layers() &&
           replica_may_fit(rep, model_static);
    if (!ok)
      continue;
    std::vector<std::vector<int>> signature;
    for (const auto& rep : reps) {
      std::vector<int> s;
      for (int c : rep)
        s.push_back(sym[static_cast<std::size_t>(c)]);
      signature.push_back(s);
    }
    std::sort(signature.begin(), signature.end());
    if (!seen.insert(signature).second)
      continue;
    pipeline_candidate c;
    for (auto& rep : reps)
      c.groups.push_back(replica_group{{rep}});
    c.description = describe(c);
    out.push_back(std::move(c));
  }
  // Single pipelines first: they set a good bound early.
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.replicas() < b.replicas();
  });
  return out;
}

std::vector<double> planner::impl::class_speeds() {
  const int classes = static_cast<int>(class_name.size());
  std::vector<double> speed(static_cast<std::size_t>(classes));
  for (int k = 0; k < classes; ++k) {
    const chip_spec& c = *chips[static_cast<std::size_t>(
      class_members[static_cast<std::size_t>(k)].front())];
    const auto& co = costs.coefficients(c, 1);
    double t = co.block.forward_seconds + co.block.backward_seconds;
    speed[static_cast<std::size_t>(k)] = t > 0 ? 1.0 / t : 0.0;
  }
  return speed;
}

void planner::impl::stage_one_single_pipelines(
  const std::vector<double>& speed, double model_static,
  std::vector<pipeline_candidate>& out) const {
  const int classes = static_cast<int>(class_name.size());
  for (const auto& order :
       class_orders(classes, class_capacity_bytes, speed, true)) {
    std::vector<int> rep;
    for (int k : order)
      for (int c : class_members[static_cast<std::size_t>(k)])
        rep.push_back(c);
    if (static_cast<int>(rep.size()) <= layers() &&
        replica_may_fit(rep, model_static))
      out.push_back(pipeline_candidate{{replica_group{{rep}}}, ""});
  }
}

void planner::impl::stage_one_identical_replicas(
  int max_replicas, const std::vector<double>& speed, double model_static,
  std::vector<pipeline_candidate>& out) const {
  const int n = static_cast<int>(chips.size());
  const int classes = static_cast<int>(class_name.size());
  auto count = [&](int k) {
    return static_cast<int>(class_members[static_cast<std::size_t>(k)].size());
  };
  int g = 0;
  for (int k = 0; k < classes; ++k)
    g = std::gcd(g, count(k));
  for (int r = 2; r <= std::min(g, max_replicas); ++r) {
    if (g % r != 0 || sequences() % r != 0 || n / r > layers())
      continue;
    for (const auto& order :
         class_orders(classes, class_capacity_bytes, speed, false)) {
      replica_group grp;
      for (int q = 0; q < r; ++q) {
        std::vector<int> rep;
        for (int k : order) {
          const auto& mem = class_members[static_cast<std::size_t>(k)];
          const int per = count(k) / r;
          for (int i = q * per; i < (q + 1) * per; ++i)
            rep.push_back(mem[static_cast<std::size_t>(i)]);
        }
        grp.replicas.push_back(std::move(rep));
      }
      if (!replica_may_fit(grp.replicas.front(), model_static))
        break; // every order holds the same chips
      out.push_back(pipeline_candidate{{grp}, ""});
    }
  }
}

void planner::impl::stage_one_class_replicas(
  int max_replicas, double model_static,
  std::vector<pipeline_candidate>& out) const {
  const int classes = static_cast<int>(class_name.size());
  auto count = [&](int k) {
    return static_cast<int>(class_members[static_cast<std::size_t>(k)].size());
  };
  // Per class, the replica counts that can work, fewest first.
  std::vector<std::vector<int>> choices(static_cast<std::size_t>(classes));
  for (int k = 0; k < classes; ++k) {
    for (int r = 1; r <= count(k); ++r) {
      if (count(k) % r != 0 || count(k) / r > layers())
        continue;
      std::vector<int> rep(class_members[static_cast<std::size_t>(k)].begin(),
                           class_members[static_cast<std::size_t>(k)].begin() +
                             count(k) / r);
      if (!replica_may_fit(rep, model_static))
        break; // shallower replicas hold even less
      choices[static_cast<std::size_t>(k)].push_back(r);
      if (choices[static_cast<std::size_t>(k)].size() == 2)
        break;
    }
  }
  // Every class with a choice takes part; the first choice each, plus
  // each class's second choice alone (a handful of layouts).
  std::vector<int> pick(static_cast<std::size_t>(classes), 0);
  auto emit = [&] {
    pipeline_candidate c;
    int total = 0;
    for (int k = 0; k < classes; ++k) {
      const auto& ch = choices[static_cast<std::size_t>(k)];
      if (ch.empty())
        continue;
      const int r =
        ch[static_cast<std::size_t>(pick[static_cast<std::size_t>(k)])];
      const int per = count(k) / r;
      replica_group grp;
      const auto& mem = class_members[static_cast<std::size_t>(k)];
      for (int q = 0; q < r; ++q)
        grp.replicas.emplace_back(mem.begin() + q * per,
                                  mem.begin() + (q + 1) * per);
      total += r;
      c.groups.push_back(std::move(grp));
    }
    if (c.groups.size() >= 2 && total <= std::min(max_replicas, sequences()))
      out.push_back(std::move(c));
  };
  emit();
  for (int k = 0; k < classes; ++k)
    if (choices[static_cast<std::size_t>(k)].size() == 2) {
      pick[static_cast<std::size_t>(k)] = 1;
      emit();
      pick[static_cast<std::size_t>(k)] = 0;
    }
}

std::vector<pipeline_candidate> planner::impl::stage_one() {
  const int n = static_cast<int>(chips.size());
  const int max_r = options.max_replicas > 0 ? options.max_replicas : n;
  const int classes = static_cast<int>(class_name.size());

  // The model's weights, gradients and moments: a replica whose chips hold
  // less cannot fit whatever its partition.
  const double model_static = model_static_bytes(max_r);

  if (n <= options.exhaustive_chips)
    return stage_one_exhaustive(max_r, model_static);

  // Structured layouts. Per class: memory and speed (a block's forward and
  // backward at one sequence per micro-batch, as measured).
  const std::vector<double> speed = class_speeds();
  std::vector<pipeline_candidate> out;

  // (a) One pipeline: the classes in some order, a class's chips together
  // in id (node) order, so neighbouring stages share a node where they can.
  stage_one_single_pipelines(speed, model_static, out);

  // (b) R identical replicas of mixed classes: replica r takes the r-th
  // slice of every class (node-contiguous), the batch split evenly.
  if (max_r >= 2)
    stage_one_identical_replicas(max_r, speed, model_static, out);

  // (c) Heterogeneous data parallelism: every class forms its own identical
  // replicas (as deep as memory needs, as shallow as layers allow), the
  // batch split between the classes by stage 2.
  if (classes >= 2 && max_r >= classes)
    stage_one_class_replicas(max_r, model_static, out);

  for (auto& c : out)
    c.description = describe(c);
  return out;
}

} // namespace h2::scheduler
