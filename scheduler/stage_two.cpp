// Stage 2 of HeteroAuto: layers per stage, micro-batch size and count,
// recomputation, for one replica layout (docs/planner.md, "Stage 2").
//
// One group of identical replicas: branch and bound over the stages' layer
// ranges in pipeline order, with lower bounds from paths of the schedule's
// precedence graph (below) and the simulator at the leaves, seeded by a
// bottleneck-balancing heuristic improved by local search. Several groups:
// every (partition, micro-batch size) of every group and every split of the
// batch between groups when that is few enough, else a heuristic split.
//
// Recomputation is not searched: the simulated step time never decreases
// when an op gets longer (the simulator takes maxima and sums), and
// recomputation only lengthens a stage's backward while it only lowers its
// memory, so a stage recomputes exactly when it does not fit otherwise.
#include "planner_impl.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <set>

namespace h2::scheduler {

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

/// A stage's costs as the search needs them.
struct stage_value {
  bool ok = false;
  bool recompute = false;
  double forward = 0, backward = 0, optimizer = 0, allreduce = 0;
  double gradient_bytes = 0;
};

/// The best assignment found for one group.
struct group_solution {
  double step = inf;  ///< phase + max all-reduce + max optimizer
  double phase = inf; ///< the pipeline phase alone
  double optimizer = 0;
  double first_gradient_bytes = 0; ///< of the first stage
  int micro_batch_size = 0;
  std::vector<int> ends; ///< end layer of every stage
};

/// One group of identical replicas at one micro-batch size: the search's
/// view of the stages and the step time of an assignment of layers.
class group_search {
public:
  group_search(planner::impl& im, const replica_group& g, bool allreduce)
      : im_(im),
        chips_(g.replicas.size()),
        p_(static_cast<int>(g.replicas.front().size())),
        r_(static_cast<int>(g.replicas.size())),
        L_(im.layers()),
        blocks_(im.job->model.n_layer),
        allreduce_(allreduce && g.replicas.size() > 1) {
    for (std::size_t r = 0; r < g.replicas.size(); ++r)
      for (int c : g.replicas[r])
        chips_[r].push_back(im.chips[static_cast<std::size_t>(c)]);
  }

  int stages() const noexcept { return p_; }
  int micro_batches() const noexcept { return m_; }
  int micro_batch_size() const noexcept { return mu_; }

  /// Prepares every per-stage figure for micro-batches of `mu` sequences
  /// out of `sequences` per replica.
  void setup(int mu, int sequences) {
    mu_ = mu;
    m_ = sequences / mu;
    const auto P = static_cast<std::size_t>(p_);
    coef_.assign(P, nullptr);
    cap_.assign(P, inf);
    inflight_.assign(P, 0);
    for (int s = 0; s < p_; ++s) {
      const auto i = static_cast<std::size_t>(s);
      coef_[i] = &im_.costs.coefficients(*chips_[0][i], mu);
      for (const auto& rep : chips_)
        cap_[i] = std::min(cap_[i], im_.costs.capacity_bytes(*rep[i]));
      inflight_[i] = in_flight_bound(im_.kind, p_, s, m_);
    }
    // Link patterns: replicas whose links are alike simulate alike.
    patterns_.clear();
    for (const auto& rep : chips_) {
      std::vector<double> a(P, 0.0), g(P, 0.0);
      for (std::size_t s = 0; s < P; ++s) {
        if (s > 0)
          a[s] = im_.costs.boundary_seconds(*rep[s - 1], *rep[s], mu);
        if (s + 1 < P)
          g[s] = im_.costs.boundary_seconds(*rep[s + 1], *rep[s], mu);
      }
      auto pat = std::make_pair(a, g);
      if (std::find(patterns_.begin(), patterns_.end(), pat) == patterns_.end())
        patterns_.push_back(std::move(pat));
    }
    alink_min_ = patterns_.front().first;
    glink_min_ = patterns_.front().second;
    for (const auto& [a, g] : patterns_)
      for (std::size_t s = 0; s < P; ++s) {
        alink_min_[s] = std::min(alink_min_[s], a[s]);
        glink_min_[s] = std::min(glink_min_[s], g[s]);
      }
    // The ring of every stage position across the replicas, and the
    // all-reduce of each layer count there (memoised: it depends on the
    // stage's layers, not on the micro-batch size).
    if (rings_.empty()) {
      rings_.assign(P, {});
      allreduce_memo_.assign(
        P,
        std::vector<double>(4 * static_cast<std::size_t>(blocks_ + 1), -1.0));
      if (allreduce_)
        for (std::size_t s = 0; s < P; ++s) {
          std::vector<const chip_spec*> ring;
          for (int r = 0; r < r_; ++r)
            ring.push_back(chips_[static_cast<std::size_t>(r)][s]);
          rings_[s] = im_.costs.ring_links(ring);
        }
    }
    prepare_bounds();
  }

  /// The stage at position `s` holding `layers` (minimal recomputation).
  stage_value eval(int s, const stage_layers& layers) const {
    const auto i = static_cast<std::size_t>(s);
    stage_value v;
    stage_cost c = coef_[i]->cost(layers, false);
    if (c.peak_bytes(inflight_[i]) > cap_[i]) {
      if (!im_.options.allow_recompute)
        return v;
      c = coef_[i]->cost(layers, true);
      if (c.peak_bytes(inflight_[i]) > cap_[i])
        return v;
    }
    v.ok = true;
    v.recompute = c.recompute;
    v.forward = c.forward_seconds;
    v.backward = c.backward_seconds;
    v.optimizer = c.optimizer_seconds;
    v.allreduce = allreduce_seconds(s, layers);
    v.gradient_bytes = c.gradient_bytes;
    return v;
  }

  stage_value eval(int s, int first, int end) const {
    return eval(s, stage_layers::of(im_.job->model, first, end));
  }

  /// Layers of the stage at `s` holding `k` blocks.
  stage_layers layers_with(int s, int k) const {
    stage_layers l;
    l.embedding = s == 0;
    l.head = s == p_ - 1;
    l.blocks = k;
    return l;
  }

  /// The step of an assignment (ends of every stage), as simulate() of the
  /// group's replicas computes it when the group is alone; inf when a stage
  /// does not fit.
  group_solution evaluate(const std::vector<int>& ends) {
    const auto P = static_cast<std::size_t>(p_);
    fwd_.resize(P);
    bwd_.resize(P);
    ar_.resize(P);
    double opt = 0, first_bytes = 0;
    int first = 0;
    for (std::size_t s = 0; s < P; ++s) {
      auto v = eval(static_cast<int>(s), first, ends[s]);
      if (!v.ok)
        return {};
      fwd_[s] = v.forward;
      bwd_[s] = v.backward;
      ar_[s] = v.allreduce;
      opt = std::max(opt, v.optimizer);
      first = ends[s];
      if (s == 0)
        first_bytes = v.gradient_bytes;
    }
    // As simulate(): each stage position's all-reduce starts when that
    // position is done in every replica; then the norm, then the updates.
    ends_at_.assign(P, 0.0);
    double makespan = 0;
    for (const auto& [a, g] : patterns_) {
      makespan =
        std::max(makespan, im_.sim.makespan(im_.kind, p_, m_, fwd_.data(),
                                            bwd_.data(), a.data(), g.data()));
      const auto& e = im_.sim.stage_ends();
      for (std::size_t s = 0; s < P; ++s)
        ends_at_[s] = std::max(ends_at_[s], e[s]);
    }
    double phase = 0;
    for (std::size_t s = 0; s < P; ++s)
      phase = std::max(phase, allreduce_ ? ends_at_[s] + ar_[s] : ends_at_[s]);
    group_solution out;
    out.phase = allreduce_ ? phase : makespan;
    out.optimizer = opt;
    out.first_gradient_bytes = first_bytes;
    out.step = out.phase + opt;
    out.micro_batch_size = mu_;
    out.ends = ends;
    return out;
  }

  /// The bottleneck-balancing heuristic: the smallest per-stage compute
  /// bound every stage can meet within memory, surplus blocks taken from
  /// the most loaded stages, then local search by simulation. An empty
  /// solution when nothing fits.
  group_solution heuristic() {
    const auto P = static_cast<std::size_t>(p_);
    if (p_ == 1)
      return evaluate({L_});
    // Per stage: the most blocks that fit, and F + B per block count.
    std::vector<int> kmin(P), kmax(P);
    std::vector<std::vector<double>> load(P);
    std::vector<double> values;
    int min_total = 0;
    for (int s = 0; s < p_; ++s) {
      const auto i = static_cast<std::size_t>(s);
      kmin[i] = (s == 0 || s == p_ - 1) ? 0 : 1;
      min_total += kmin[i];
      kmax[i] = kmin[i] - 1;
      for (int k = kmin[i]; k <= blocks_; ++k) {
        auto v = eval(s, layers_with(s, k));
        if (!v.ok)
          break;
        kmax[i] = k;
        load[i].push_back(v.forward + v.backward);
        values.push_back(v.forward + v.backward);
      }
      if (kmax[i] < kmin[i])
        return {};
    }
    if (min_total > blocks_)
      return {};
    std::sort(values.begin(), values.end());
    auto count_at = [&](double tau, std::vector<int>* ks) {
      int total = 0;
      for (std::size_t i = 0; i < P; ++i) {
        const auto& l = load[i];
        auto it = std::upper_bound(l.begin(), l.end(), tau);
        int k = kmin[i] + static_cast<int>(it - l.begin()) - 1;
        if (k < kmin[i])
          return -1;
        if (ks != nullptr)
          (*ks)[i] = k;
        total += k;
      }
      return total;
    };
    std::size_t lo = 0, hi = values.size();
    while (lo < hi) { // the smallest value with enough room
      std::size_t mid = (lo + hi) / 2;
      if (count_at(values[mid], nullptr) >= blocks_)
        hi = mid;
      else
        lo = mid + 1;
    }
    if (lo == values.size())
      return {};
    std::vector<int> k(P);
    int total = count_at(values[lo], &k);
    while (total > blocks_) {
      std::size_t worst = P;
      for (std::size_t i = 0; i < P; ++i)
        if (k[i] > kmin[i] &&
            (worst == P ||
             load[i][static_cast<std::size_t>(k[i] - kmin[i])] >
               load[worst][static_cast<std::size_t>(k[worst] - kmin[worst])]))
          worst = i;
      --k[worst];
      --total;
    }
    group_solution best = evaluate(ends_of(k));
    if (!std::isfinite(best.step))
      return best;
    local_search(k, kmin, kmax, best);
    return best;
  }

  /// Branch and bound from `best` (an incumbent, possibly empty):
  /// improves it to the optimum of this micro-batch size. Returns false
  /// when the node budget ran out first.
  bool branch_and_bound(group_solution& best, std::size_t budget,
                        std::size_t& nodes) {
    best_ = &best;
    budget_ = budget;
    nodes_ = &nodes;
    aborted_ = false;
    const auto P = static_cast<std::size_t>(p_);
    path_.assign(P, {});
    ends_.assign(P, 0);
    // A leaf costs a simulation: charge it by its size.
    leaf_cost_ = std::max<std::size_t>(1, static_cast<std::size_t>(p_) *
                                            static_cast<std::size_t>(m_) / 16);
    dfs(0, 0);
    return !aborted_;
  }

  /// Calls `f` with every assignment whose stages all fit.
  void enumerate(const std::function<void(const std::vector<int>&)>& f) {
    ends_.assign(static_cast<std::size_t>(p_), 0);
    enumerate_from(0, 0, f);
  }

  /// The recomputation flag of every stage of an assignment.
  std::vector<bool> recompute_of(const std::vector<int>& ends) const {
    std::vector<bool> out;
    int first = 0;
    for (int s = 0; s < p_; ++s) {
      out.push_back(
        eval(s, first, ends[static_cast<std::size_t>(s)]).recompute);
      first = ends[static_cast<std::size_t>(s)];
    }
    return out;
  }

private:
  double allreduce_seconds(int s, const stage_layers& layers) const {
    const auto& ring = rings_[static_cast<std::size_t>(s)];
    if (ring.size() < 2)
      return 0;
    double& memo =
      allreduce_memo_[static_cast<std::size_t>(s)]
                     [4 * static_cast<std::size_t>(layers.blocks) +
                      (layers.embedding ? 2 : 0) + (layers.head ? 1 : 0)];
    if (memo < 0)
      memo = im_.costs.allreduce_seconds(ring, im_.costs.buckets(layers));
    return memo;
  }

  std::vector<int> ends_of(const std::vector<int>& k) const {
    std::vector<int> ends;
    int at = 0;
    for (int s = 0; s < p_; ++s) {
      at += k[static_cast<std::size_t>(s)] + (s == 0 ? 1 : 0) +
            (s == p_ - 1 ? 1 : 0);
      ends.push_back(at);
    }
    return ends;
  }

  /// Moves one block at a time between units (runs of consecutive stages
  /// of one chip class and role), best improvement first, while the
  /// simulated step improves.
  void local_search(std::vector<int>& k, const std::vector<int>& kmin,
                    const std::vector<int>& kmax, group_solution& best) {
    const auto P = static_cast<std::size_t>(p_);
    std::vector<std::pair<int, int>> units; // [first, end) positions
    for (int s = 0; s < p_;) {
      int e = s + 1;
      auto cls = [&](int i) {
        return im_.chip_class[static_cast<std::size_t>(
          std::find(im_.chips.begin(), im_.chips.end(),
                    chips_[0][static_cast<std::size_t>(i)]) -
          im_.chips.begin())];
      };
      if (s != 0)
        while (e < p_ - 1 && cls(e) == cls(s))
          ++e;
      units.emplace_back(s, e);
      s = e;
    }
    const int iterations = 2 * L_;
    for (int it = 0; it < iterations; ++it) {
      group_solution step_best = best;
      std::vector<int> k_best;
      for (const auto& [uf, ue] : units)
        for (const auto& [vf, ve] : units) {
          if (uf == vf)
            continue;
          // Take from the fullest stage of U (earliest), give to the
          // emptiest of V (latest): units stay even.
          std::size_t from = P, to = P;
          for (int i = uf; i < ue; ++i) {
            auto x = static_cast<std::size_t>(i);
            if (k[x] > kmin[x] && (from == P || k[x] > k[from]))
              from = x;
          }
          for (int i = vf; i < ve; ++i) {
            auto x = static_cast<std::size_t>(i);
            if (k[x] < kmax[x] && (to == P || k[x] <= k[to]))
              to = x;
          }
          if (from == P || to == P)
            continue;
          --k[from];
          ++k[to];
          auto sol = evaluate(ends_of(k));
          if (sol.step < step_best.step) {
            step_best = sol;
            k_best = k;
          }
          ++k[from];
          --k[to];
        }
      if (k_best.empty())
        return;
      best = step_best;
      k = k_best;
    }
  }

  /// Lower bounds of the unassigned stages, by suffix.
  void prepare_bounds() {
    const auto P = static_cast<std::size_t>(p_);
    const double m1 = m_ - 1;
    fb_block_.assign(P, 0);
    suffix_fb_mid_.assign(P + 1, 0);
    suffix_min_fb_.assign(P + 1, inf);
    for (auto* v : {&suffix_h_, &suffix_f_, &suffix_b_})
      *v = {std::vector<double>(P + 1, 0), std::vector<double>(P + 1, 0),
            std::vector<double>(P + 1, -inf), std::vector<double>(P + 1, 0)};
    const auto& head = coef_[P - 1]->head;
    for (std::size_t s = P; s-- > 0;) {
      const auto& blk = coef_[s]->block;
      fb_block_[s] = blk.forward_seconds + blk.backward_seconds;
      const bool last = s + 1 == P;
      suffix_fb_mid_[s] = suffix_fb_mid_[s + 1] + (last ? 0.0 : fb_block_[s]);
      suffix_min_fb_[s] = std::min(suffix_min_fb_[s + 1], fb_block_[s]);
      const double w = std::min<double>(p_ - 1 - static_cast<int>(s), m1);
      // h(k) = alpha + beta k, with at least kmin blocks.
      auto add = [&](relaxation& r, double alpha, double beta) {
        const double kmin = last ? 0 : 1;
        r.inv[s] = r.inv[s + 1] + (beta > 0 ? 1.0 / beta : 0.0);
        r.ratio[s] = r.ratio[s + 1] + (beta > 0 ? alpha / beta : 0.0);
        r.floor[s] = std::max(r.floor[s + 1], alpha + beta * kmin);
        r.zero[s] = r.zero[s + 1] + (beta > 0 ? 0.0 : 1.0);
      };
      add(suffix_h_,
          last ? m1 * (head.forward_seconds + head.backward_seconds) : 0.0,
          (m1 - w) * blk.forward_seconds + m1 * blk.backward_seconds);
      add(suffix_f_, last ? head.forward_seconds : 0.0, blk.forward_seconds);
      add(suffix_b_, last ? head.backward_seconds : 0.0, blk.backward_seconds);
    }
    head_fb_ = head.forward_seconds + head.backward_seconds;
    prefix_links_.assign(P + 1, 0);
    // Links of a path from stage 0 to j and back: into 1..j forward, into
    // 0..j-1 backward.
    for (std::size_t j = 0; j <= P; ++j) {
      double x = 0;
      for (std::size_t i = 1; i <= std::min(j, P - 1); ++i)
        x += alink_min_[i];
      for (std::size_t i = 0; i + 1 <= j && i + 1 < P; ++i)
        x += glink_min_[i];
      prefix_links_[j] = x;
    }
    links_total_ = prefix_links_[P - 1];
    auto last_min = eval(p_ - 1, layers_with(p_ - 1, 0));
    last_optimizer_ = last_min.ok ? last_min.optimizer : 0;
  }

  /// min over distributions of `blocks` blocks over stages from..p-1 of
  /// the largest alpha + beta k: a bound from the continuous relaxation.
  struct relaxation {
    std::vector<double> inv, ratio, floor, zero;
  };
  static double relaxed(const relaxation& r, std::size_t from, int blocks) {
    double tau = r.floor[from];
    if (r.zero[from] == 0 && r.inv[from] > 0)
      tau = std::max(tau, (blocks + r.ratio[from]) / r.inv[from]);
    return tau;
  }

  /// Per assigned stage: running sums and maxima of the path bounds.
  struct path_state {
    double known_fb = 0; ///< sum of F + B of stages 0..s
    double max_a = 0;    ///< longest "stage 0..j-1 then all of j" path
    double max_h = 0;    ///< largest (m-1-w)F + (m-1)B of stages 0..s
    double max_f = 0, max_b = 0, max_o = 0, max_ar = 0;
  };

  double lower_bound(int s, int next_first) const {
    const auto& st = path_[static_cast<std::size_t>(s)];
    // Stage 0 ends last; its all-reduce and the slowest update follow.
    const double extra = path_[0].max_ar + std::max(st.max_o, last_optimizer_);
    if (s == p_ - 1) {
      double sum = st.known_fb + links_total_;
      if (im_.kind == schedule_kind::gpipe)
        return sum + (m_ - 1) * (st.max_f + st.max_b) + extra;
      return std::max(st.max_a, sum + st.max_h) + extra;
    }
    const auto from = static_cast<std::size_t>(s + 1);
    const int mid = p_ - 2 - s;
    const int rest_blocks = L_ - next_first - 1;
    double rest_fb = head_fb_ + suffix_fb_mid_[from] +
                     (rest_blocks - mid) * suffix_min_fb_[from];
    double sum = st.known_fb + rest_fb + links_total_;
    if (im_.kind == schedule_kind::gpipe)
      return sum +
             (m_ - 1) *
               (std::max(st.max_f, relaxed(suffix_f_, from, rest_blocks)) +
                std::max(st.max_b, relaxed(suffix_b_, from, rest_blocks))) +
             extra;
    return std::max(st.max_a, sum + std::max(st.max_h, relaxed(suffix_h_, from,
                                                               rest_blocks))) +
           extra;
  }

  void push(int s, const stage_value& v) {
    const auto i = static_cast<std::size_t>(s);
    path_state st = s > 0 ? path_[i - 1] : path_state{};
    const double fb = v.forward + v.backward;
    st.max_a = std::max(st.max_a, st.known_fb + prefix_links_[i] + m_ * fb);
    st.known_fb += fb;
    const double w = std::min<double>(p_ - 1 - s, m_ - 1);
    st.max_h =
      std::max(st.max_h, (m_ - 1 - w) * v.forward + (m_ - 1) * v.backward);
    st.max_f = std::max(st.max_f, v.forward);
    st.max_b = std::max(st.max_b, v.backward);
    st.max_o = std::max(st.max_o, v.optimizer);
    st.max_ar = std::max(st.max_ar, v.allreduce);
    path_[i] = st;
  }

  /// The largest end for the stage at `s` starting at `first` that fits,
  /// within [lo, hi]; lo - 1 when none does (memory grows with layers).
  int max_end(int s, int first, int lo, int hi) const {
    if (!eval(s, first, lo).ok)
      return lo - 1;
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (eval(s, first, mid).ok)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }

  void dfs(int s, int first) {
    if (aborted_)
      return;
    const auto i = static_cast<std::size_t>(s);
    if (s == p_ - 1) {
      if (++*nodes_ > budget_) {
        aborted_ = true;
        return;
      }
      auto v = eval(s, first, L_);
      if (!v.ok)
        return;
      push(s, v);
      ends_[i] = L_;
      if (lower_bound(s, L_) >= best_->step)
        return;
      *nodes_ += leaf_cost_;
      auto sol = evaluate(ends_);
      if (sol.step < best_->step)
        *best_ = sol;
      return;
    }
    const int lo = first + 1;
    const int hi = max_end(s, first, lo, L_ - (p_ - 1 - s));
    if (hi < lo)
      return;
    // Closest to the incumbent's boundary first, then outwards.
    int guess =
      best_->ends.empty() ? first + (L_ - first) / (p_ - s) : best_->ends[i];
    guess = std::clamp(guess, lo, hi);
    for (int d = 0; guess - d >= lo || guess + d <= hi; ++d)
      for (int side = 0; side < (d == 0 ? 1 : 2); ++side) {
        const int end = side == 0 ? guess + d : guess - d;
        if (end < lo || end > hi)
          continue;
        if (++*nodes_ > budget_) {
          aborted_ = true;
          return;
        }
        auto v = eval(s, first, end);
        push(s, v);
        ends_[i] = end;
        if (lower_bound(s, end) < best_->step)
          dfs(s + 1, end);
        if (aborted_)
          return;
      }
  }

  void enumerate_from(int s, int first,
                      const std::function<void(const std::vector<int>&)>& f) {
    const auto i = static_cast<std::size_t>(s);
    if (s == p_ - 1) {
      if (eval(s, first, L_).ok) {
        ends_[i] = L_;
        f(ends_);
      }
      return;
    }
    const int lo = first + 1;
    const int hi = max_end(s, first, lo, L_ - (p_ - 1 - s));
    for (int end = lo; end <= hi; ++end) {
      ends_[i] = end;
      enumerate_from(s + 1, end, f);
    }
  }

  planner::impl& im_;
  std::vector<std::vector<const chip_spec*>> chips_; ///< [replica][stage]
  int p_, r_, L_, blocks_;
  bool allreduce_;
  int mu_ = 1, m_ = 1;
  std::vector<const stage_coefficients*> coef_;
  std::vector<double> cap_;
  std::vector<int> inflight_;
  std::vector<std::pair<std::vector<double>, std::vector<double>>> patterns_;
  std::vector<double> alink_min_, glink_min_;
  std::vector<std::vector<link_figures>> rings_;
  mutable std::vector<std::vector<double>> allreduce_memo_;
  std::vector<double> fwd_, bwd_, ar_, ends_at_;
  // Bounds.
  std::vector<double> fb_block_, suffix_fb_mid_, suffix_min_fb_, prefix_links_;
  relaxation suffix_h_, suffix_f_, suffix_b_;
  double head_fb_ = 0, links_total_ = 0, last_optimizer_ = 0;
  // Branch-and-bound state.
  group_solution* best_ = nullptr;
  std::size_t budget_ = 0;
  std::size_t* nodes_ = nullptr;
  std::size_t leaf_cost_ = 1;
  bool aborted_ = false;
  std::vector<path_state> path_;
  std::vector<int> ends_;
};

/// Appends a group's replicas, all with `sol`, to `p`.
void add_replicas(planner::impl& im, const replica_group& g,
                  group_search& search, const group_solution& sol,
                  int sequences_per_replica, plan& p) {
  search.setup(sol.micro_batch_size, sequences_per_replica);
  auto rc = search.recompute_of(sol.ends);
  for (const auto& rep : g.replicas) {
    replica_plan r;
    r.micro_batch_size = sol.micro_batch_size;
    r.micro_batches = sequences_per_replica / sol.micro_batch_size;
    int first = 0;
    for (std::size_t s = 0; s < rep.size(); ++s) {
      stage_plan sp;
      sp.chip = im.chips[static_cast<std::size_t>(rep[s])]->id;
      sp.first_layer = first;
      sp.end_layer = sol.ends[s];
      sp.recompute = rc[s];
      first = sol.ends[s];
      r.stages.push_back(sp);
    }
    p.replicas.push_back(std::move(r));
  }
}

/// n choose k, as a double (it overflows integers for deep pipelines).
double binomial(int n, int k) {
  double r = 1;
  for (int i = 1; i <= k; ++i)
    r = r * (n - k + i) / i;
  return r;
}

/// The best solution of one group at `sequences` per replica (all
/// micro-batch sizes), improving on `bound`.
group_solution solve_group(planner::impl& im, group_search& search,
                           int sequences, double bound, bool& proven,
                           std::size_t& nodes) {
  group_solution best;
  best.step = bound;
  // Branch and bound proves optimality where the space of partitions is
  // within reach; beyond it, a small budget only polishes the heuristic.
  const auto sizes = im.micro_batch_sizes(sequences);
  const double space = binomial(im.layers() - 1, search.stages() - 1) *
                       static_cast<double>(sizes.size());
  const std::size_t budget =
    space <= 1e9 ? im.options.search_nodes
                 : std::min<std::size_t>(im.options.search_nodes, 2000);
  for (int mu : sizes) {
    search.setup(mu, sequences);
    auto h = search.heuristic();
    if (h.step < best.step)
      best = h;
    std::size_t used = 0;
    bool complete = search.branch_and_bound(best, budget, used);
    nodes += used;
    proven = proven && complete;
  }
  if (best.ends.empty())
    best.step = inf;
  return best;
}

/// Splits `total` sequences between groups in proportion to `weight`,
/// each group a positive multiple of its replica count. Empty when
/// impossible.
std::vector<int> proportional_split(int total, const std::vector<int>& unit,
                                    const std::vector<double>& weight) {
  const std::size_t g = unit.size();
  std::vector<int> n(g);
  double wsum = std::accumulate(weight.begin(), weight.end(), 0.0);
  int sum = 0;
  for (std::size_t i = 0; i < g; ++i) {
    double share = wsum > 0 ? total * weight[i] / wsum : total / double(g);
    n[i] = std::max(unit[i],
                    static_cast<int>(std::floor(share / unit[i])) * unit[i]);
    sum += n[i];
  }
  // Fix the sum one unit at a time: add where the share is most short,
  // remove where it is most over.
  for (int guard = 0; sum != total && guard < 4 * total; ++guard) {
    std::size_t pick = g;
    double score = -inf;
    for (std::size_t i = 0; i < g; ++i) {
      double share = wsum > 0 ? total * weight[i] / wsum : total / double(g);
      if (sum < total) {
        if (sum + unit[i] > total)
          continue;
        double s = share - n[i];
        if (s > score)
          score = s, pick = i;
      } else {
        if (n[i] - unit[i] < unit[i])
          continue;
        double s = n[i] - share;
        if (s > score)
          score = s, pick = i;
      }
    }
    if (pick == g)
      return {};
    int d = sum < total ? unit[pick] : -unit[pick];
    n[pick] += d;
    sum += d;
  }
  if (sum != total)
    return {};
  return n;
}

} // namespace

stage_two_result planner::impl::stage_two(const pipeline_candidate& c,
                                          double bound) {
  stage_two_result out;
  out.proven_optimal = true;
  const std::size_t G = c.groups.size();
  const std::size_t sims_before = sim.runs() + simulations;
  const int B = sequences();
  auto finish = [&](stage_two_result& r) -> stage_two_result& {
    r.simulations = sim.runs() + simulations - sims_before;
    return r;
  };

  if (G == 1) {
    const auto& g = c.groups.front();
    const int R = static_cast<int>(g.replicas.size());
    if (B % R != 0) {
      out.proven_optimal = true;
      return finish(out);
    }
    group_search search(*this, g, true);
    bool proven = true;
    auto best = solve_group(*this, search, B / R, bound, proven, out.nodes);
    out.proven_optimal = proven;
    if (!std::isfinite(best.step))
      return finish(out);
    out.feasible = true;
    out.step_seconds = best.step;
    out.value.schedule = kind;
    add_replicas(*this, g, search, best, B / R, out.value);
    return finish(out);
  }

  // Several groups: the split of the batch and every group's assignment.
  std::vector<int> unit(G);
  std::vector<std::unique_ptr<group_search>> searches;
  for (std::size_t i = 0; i < G; ++i) {
    unit[i] = static_cast<int>(c.groups[i].replicas.size());
    searches.push_back(
      std::make_unique<group_search>(*this, c.groups[i], false));
  }
  // Splits: n_g a positive multiple of unit_g, summing to B.
  std::vector<std::vector<int>> splits;
  bool truncated = false;
  {
    std::vector<int> n(G);
    std::function<void(std::size_t, int)> rec = [&](std::size_t i, int left) {
      if (splits.size() > 100000) {
        truncated = true;
        return;
      }
      if (i + 1 == G) {
        if (left >= unit[i] && left % unit[i] == 0) {
          n[i] = left;
          splits.push_back(n);
        }
        return;
      }
      for (int x = unit[i]; x <= left; x += unit[i]) {
        n[i] = x;
        rec(i + 1, left - x);
      }
    };
    rec(0, B);
  }
  if (splits.empty())
    return finish(out);
  // The size of the exact enumeration: every (group, sequences per
  // replica): its partitions times its micro-batch sizes.
  double options_count = 0;
  {
    std::vector<std::set<int>> per(G);
    for (const auto& s : splits)
      for (std::size_t i = 0; i < G; ++i)
        per[i].insert(s[i] / unit[i]);
    for (std::size_t i = 0; i < G; ++i)
      for (int seqs : per[i])
        options_count += binomial(layers() - 1, searches[i]->stages() - 1) *
                         static_cast<double>(micro_batch_sizes(seqs).size());
  }

  auto build = [&](const std::vector<int>& split,
                   const std::vector<const group_solution*>& sols) {
    plan p;
    p.schedule = kind;
    for (std::size_t i = 0; i < G; ++i)
      add_replicas(*this, c.groups[i], *searches[i], *sols[i],
                   split[i] / unit[i], p);
    return p;
  };
  stage_two_result best;
  best.step_seconds = bound;
  auto consider = [&](const std::vector<int>& split,
                      const std::vector<const group_solution*>& sols) {
    plan p = build(split, sols);
    auto s = simulate_plan(p, false);
    if (s.fits && s.step_seconds < best.step_seconds) {
      best.feasible = true;
      best.step_seconds = s.step_seconds;
      best.value = std::move(p);
    }
  };

  if (!truncated &&
      options_count <= static_cast<double>(options.joint_options)) {
    // Exact: all options of every group per sequences per replica, sorted
    // by a lower bound of any step they are in: their own phase, the least
    // all-reduce their first stage (which ends last) can have, and their
    // update.
    //
    // The all-reduce bound: every bucket of a chip's gradients crosses the
    // ring edge into the chip 2 (R - 1) times, from a chip of another
    // replica; at best the fastest such link, at least one bucket.
    const int replicas_total = c.replicas();
    const double wire = job->transport.reduce_dtype == dtype::fp32 ? 1.0 : 0.5;
    std::vector<std::pair<double, double>> inbound(G, {inf, inf});
    for (std::size_t i = 0; i < G; ++i) {
      // The least favourable replica of the group: its bound holds for
      // every replica.
      double lat_bound = inf, inv_bound = inf;
      bool first = true;
      for (std::size_t r = 0; r < c.groups[i].replicas.size(); ++r) {
        const chip_spec& me =
          *chips[static_cast<std::size_t>(c.groups[i].replicas[r].front())];
        double lat = inf, inv = inf;
        for (std::size_t j = 0; j < G; ++j)
          for (std::size_t q = 0; q < c.groups[j].replicas.size(); ++q) {
            if (j == i && q == r)
              continue;
            for (int other : c.groups[j].replicas[q]) {
              auto l = costs.link(*chips[static_cast<std::size_t>(other)], me);
              lat = std::min(lat, l.time_scale * l.latency_seconds);
              inv =
                std::min(inv, std::isinf(l.bandwidth_bytes_per_second)
                                ? 0.0
                                : l.time_scale / l.bandwidth_bytes_per_second);
            }
          }
        if (first || lat + inv < lat_bound + inv_bound) {
          lat_bound = lat;
          inv_bound = inv;
          first = false;
        }
      }
      inbound[i] = {lat_bound, inv_bound};
    }
    auto key_of = [&](std::size_t i, const group_solution& sol) {
      const double ar =
        2.0 * (replicas_total - 1) *
        (inbound[i].first +
         sol.first_gradient_bytes * wire / replicas_total * inbound[i].second);
      // A bound, so round it down a hair against floating-point noise.
      return (sol.phase + ar + sol.optimizer) * (1 - 1e-12);
    };
    std::map<std::pair<std::size_t, int>, std::vector<group_solution>> all;
    for (const auto& split : splits)
      for (std::size_t i = 0; i < G; ++i) {
        const int seqs = split[i] / unit[i];
        auto key = std::make_pair(i, seqs);
        if (all.count(key) != 0)
          continue;
        auto& list = all[key];
        for (int mu : micro_batch_sizes(seqs)) {
          searches[i]->setup(mu, seqs);
          searches[i]->enumerate([&](const std::vector<int>& ends) {
            auto sol = searches[i]->evaluate(ends);
            if (std::isfinite(sol.step))
              list.push_back(sol);
          });
        }
        std::sort(list.begin(), list.end(), [&](const auto& a, const auto& b) {
          return key_of(i, a) < key_of(i, b);
        });
      }
    std::vector<const group_solution*> pick(G);
    // Combinations simulated at most (beyond: not proven optimal).
    const std::size_t cap = 20 * options.joint_options;
    std::size_t simulated = 0;
    for (const auto& split : splits) {
      std::function<void(std::size_t, double)> rec = [&](std::size_t i,
                                                         double lb) {
        if (i == G) {
          if (++simulated <= cap)
            consider(split, pick);
          return;
        }
        for (const auto& sol : all[{i, split[i] / unit[i]}]) {
          double v = std::max(lb, key_of(i, sol));
          if (v >= best.step_seconds || simulated > cap)
            break; // sorted: every later option is no better
          pick[i] = &sol;
          rec(i + 1, v);
        }
      };
      rec(0, 0.0);
    }
    best.proven_optimal = simulated <= cap;
  } else {
    // Heuristic: split in proportion to each group's throughput, solve,
    // rebalance on the simulated phases, a few rounds.
    best.proven_optimal = false;
    std::vector<double> weight(G);
    for (std::size_t i = 0; i < G; ++i) {
      double speed = 0;
      for (int chip : c.groups[i].replicas.front()) {
        const auto& co =
          costs.coefficients(*chips[static_cast<std::size_t>(chip)], 1);
        double t = co.block.forward_seconds + co.block.backward_seconds;
        speed += t > 0 ? 1.0 / t : 0.0;
      }
      weight[i] = speed * unit[i];
    }
    std::vector<std::vector<int>> tried;
    for (int round = 0; round < 4; ++round) {
      auto split = proportional_split(B, unit, weight);
      if (split.empty() ||
          std::find(tried.begin(), tried.end(), split) != tried.end())
        break;
      tried.push_back(split);
      std::vector<group_solution> sols(G);
      std::vector<const group_solution*> pick(G);
      bool ok = true;
      for (std::size_t i = 0; i < G && ok; ++i) {
        bool proven = true;
        sols[i] = solve_group(*this, *searches[i], split[i] / unit[i], inf,
                              proven, out.nodes);
        ok = std::isfinite(sols[i].step);
        pick[i] = &sols[i];
      }
      if (!ok)
        break;
      consider(split, pick);
      // Throughput of each group at its share: sequences per phase second.
      for (std::size_t i = 0; i < G; ++i)
        weight[i] = split[i] / std::max(sols[i].phase, 1e-300);
    }
  }
  best.nodes = out.nodes;
  return finish(best);
}

} // namespace h2::scheduler
