// Stage 2's lower bounds (docs/planner.md, "Stage 2"). Branch and bound
// prunes a partial assignment whose bound is no better than the incumbent,
// and the joint search of several groups stops at the first option whose
// bound is; so every figure here must stay at or below the simulated step
// of every plan it covers (tests/scheduler/stage_two_bounds_test.cpp).
//
// Path bounds: the step is at least the length of any path through the
// schedule's precedence graph. With F_s, B_s the forward and backward of
// stage s for one micro-batch and m micro-batches:
// - every schedule: stages 0..j-1 once forward and back, then all m
//   micro-batches of stage j ("fill path");
// - every schedule: every stage once forward and back with every link of the
//   round trip, plus the steady state: (m - 1)(max F + max B) in GPipe,
//   the largest (m - 1 - w_s) F_s + (m - 1) B_s in 1F1B (w_s = min(p - 1 -
//   s, m - 1) forwards of warm-up overlap other stages);
// then stage 0's all-reduce (it ends last) and the slowest update. The
// unassigned stages count with their fewest blocks at the cheapest block
// time, and their maxima by the continuous relaxation of the blocks left.
//
// A schedule that splits the backward (zb-h1) runs W after the backward
// has left for the previous stage, so the paths above overstate it; its
// bound is each stage's own work after the forwards that reach it, then the
// slowest update. Every schedule gets its bound by the switch in
// lower_bound(), so a new schedule cannot inherit another's by accident.
#include "stage_two_impl.hpp"

#include <algorithm>
#include <cmath>

namespace h2::scheduler::stage_two_detail {

double relaxed_bound(const relaxation& r, std::size_t from, int blocks) {
  double tau = r.max_floor[from];
  if (r.flat_stages[from] == 0 && r.sum_inverse_slope[from] > 0)
    tau = std::max(tau, (blocks + r.sum_intercept_over_slope[from]) /
                          r.sum_inverse_slope[from]);
  return tau;
}

path_bounds::path_bounds(const bound_inputs& in)
    : schedule_(in.schedule),
      stages_(static_cast<int>(in.block.size())),
      micro_batches_(in.micro_batches),
      layers_(in.layers),
      last_stage_min_optimizer_seconds_(in.last_stage_min_optimizer_seconds) {
  const auto stage_count = static_cast<std::size_t>(stages_);
  const double m1 = micro_batches_ - 1;
  suffix_one_block_seconds_.assign(stage_count + 1, 0);
  suffix_cheapest_block_seconds_.assign(stage_count + 1, inf);
  for (auto* r : {&relaxed_one_f_one_b_, &relaxed_forward_, &relaxed_backward_,
                  &relaxed_compute_})
    *r = {std::vector<double>(stage_count + 1, 0),
          std::vector<double>(stage_count + 1, 0),
          std::vector<double>(stage_count + 1, -inf),
          std::vector<double>(stage_count + 1, 0)};
  const auto& head = in.head;
  for (std::size_t s = stage_count; s-- > 0;) {
    const auto& block = in.block[s];
    const double block_seconds = block.forward_seconds + block.backward_seconds;
    const bool last = s + 1 == stage_count;
    suffix_one_block_seconds_[s] =
      suffix_one_block_seconds_[s + 1] + (last ? 0.0 : block_seconds);
    suffix_cheapest_block_seconds_[s] =
      std::min(suffix_cheapest_block_seconds_[s + 1], block_seconds);
    const double w = std::min<double>(stages_ - 1 - static_cast<int>(s), m1);
    // h(k) = alpha + beta k, with at least min_blocks blocks.
    auto add = [&](relaxation& r, double alpha, double beta) {
      const double min_blocks = last ? 0 : 1;
      r.sum_inverse_slope[s] =
        r.sum_inverse_slope[s + 1] + (beta > 0 ? 1.0 / beta : 0.0);
      r.sum_intercept_over_slope[s] =
        r.sum_intercept_over_slope[s + 1] + (beta > 0 ? alpha / beta : 0.0);
      r.max_floor[s] = std::max(r.max_floor[s + 1], alpha + beta * min_blocks);
      r.flat_stages[s] = r.flat_stages[s + 1] + (beta > 0 ? 0.0 : 1.0);
    };
    add(relaxed_one_f_one_b_,
        last ? m1 * (head.forward_seconds + head.backward_seconds) : 0.0,
        (m1 - w) * block.forward_seconds + m1 * block.backward_seconds);
    add(relaxed_forward_, last ? head.forward_seconds : 0.0,
        block.forward_seconds);
    add(relaxed_backward_, last ? head.backward_seconds : 0.0,
        block.backward_seconds);
    add(relaxed_compute_,
        last ? head.forward_seconds + head.backward_seconds : 0.0,
        block_seconds);
  }
  forward_link_seconds_.assign(stage_count + 1, 0);
  for (std::size_t j = 1; j < stage_count; ++j)
    forward_link_seconds_[j] =
      forward_link_seconds_[j - 1] + in.min_activation_link_seconds[j];
  forward_link_seconds_[stage_count] = forward_link_seconds_[stage_count - 1];
  head_seconds_ = head.forward_seconds + head.backward_seconds;
  prefix_link_seconds_.assign(stage_count + 1, 0);
  // Links of a path from stage 0 to j and back: into 1..j forward, into
  // 0..j-1 backward.
  for (std::size_t j = 0; j <= stage_count; ++j) {
    double x = 0;
    for (std::size_t i = 1; i <= std::min(j, stage_count - 1); ++i)
      x += in.min_activation_link_seconds[i];
    for (std::size_t i = 0; i + 1 <= j && i + 1 < stage_count; ++i)
      x += in.min_gradient_link_seconds[i];
    prefix_link_seconds_[j] = x;
  }
  round_trip_link_seconds_ = prefix_link_seconds_[stage_count - 1];
  path_.assign(stage_count, {});
}

void path_bounds::push(int s, const stage_value& v) {
  const auto i = static_cast<std::size_t>(s);
  path_state st = s > 0 ? path_[i - 1] : path_state{};
  const double compute = v.forward + v.backward;
  st.max_fill_path =
    std::max(st.max_fill_path,
             st.compute + prefix_link_seconds_[i] + micro_batches_ * compute);
  st.max_own_path =
    std::max(st.max_own_path,
             st.forward + forward_link_seconds_[i] + micro_batches_ * compute);
  st.compute += compute;
  st.forward += v.forward;
  const double w = std::min<double>(stages_ - 1 - s, micro_batches_ - 1);
  st.max_one_f_one_b =
    std::max(st.max_one_f_one_b, (micro_batches_ - 1 - w) * v.forward +
                                   (micro_batches_ - 1) * v.backward);
  st.max_forward = std::max(st.max_forward, v.forward);
  st.max_backward = std::max(st.max_backward, v.backward);
  st.max_optimizer = std::max(st.max_optimizer, v.optimizer);
  st.max_allreduce = std::max(st.max_allreduce, v.allreduce);
  path_[i] = st;
}

double path_bounds::lower_bound(int s, int next_first) const {
  switch (schedule_) {
    case schedule_kind::gpipe:
      return fused_bound(s, next_first, true);
    case schedule_kind::one_f_one_b:
      return fused_bound(s, next_first, false);
    case schedule_kind::interleaved_1f1b:
    case schedule_kind::zb_h1:
    case schedule_kind::zb_hetero:
      return own_work_bound(s, next_first);
  }
  return 0; // unreachable: every kind is handled above
}

double path_bounds::own_work_bound(int s, int next_first) const {
  const auto& st = path_[static_cast<std::size_t>(s)];
  const double update =
    std::max(st.max_optimizer, last_stage_min_optimizer_seconds_);
  double own = st.max_own_path;
  if (s < stages_ - 1) {
    // The stages left hold the blocks left and the head; they start after
    // the assigned stages' forwards.
    const auto from = static_cast<std::size_t>(s + 1);
    const int rest_blocks = layers_ - next_first - 1;
    own = std::max(own, st.forward + forward_link_seconds_[from] +
                          micro_batches_ * relaxed_bound(relaxed_compute_,
                                                         from, rest_blocks));
  }
  return own + update;
}

double path_bounds::fused_bound(int s, int next_first, bool gpipe) const {
  const auto& st = path_[static_cast<std::size_t>(s)];
  // Stage 0 ends last; its all-reduce and the slowest update follow.
  const double extra =
    path_[0].max_allreduce +
    std::max(st.max_optimizer, last_stage_min_optimizer_seconds_);
  if (s == stages_ - 1) {
    double sum = st.compute + round_trip_link_seconds_;
    if (gpipe)
      return sum + (micro_batches_ - 1) * (st.max_forward + st.max_backward) +
             extra;
    return std::max(st.max_fill_path, sum + st.max_one_f_one_b) + extra;
  }
  const auto from = static_cast<std::size_t>(s + 1);
  const int middle_stages = stages_ - 2 - s;
  const int rest_blocks = layers_ - next_first - 1;
  double rest_compute =
    head_seconds_ + suffix_one_block_seconds_[from] +
    (rest_blocks - middle_stages) * suffix_cheapest_block_seconds_[from];
  double sum = st.compute + rest_compute + round_trip_link_seconds_;
  if (gpipe)
    return sum +
           (micro_batches_ - 1) *
             (std::max(st.max_forward,
                       relaxed_bound(relaxed_forward_, from, rest_blocks)) +
              std::max(st.max_backward,
                       relaxed_bound(relaxed_backward_, from, rest_blocks))) +
           extra;
  return std::max(st.max_fill_path,
                  sum + std::max(st.max_one_f_one_b,
                                 relaxed_bound(relaxed_one_f_one_b_, from,
                                               rest_blocks))) +
         extra;
}

bound_inputs group_search::bound_inputs_of() const {
  const auto stage_count = static_cast<std::size_t>(stages_);
  bound_inputs in;
  in.schedule = planner_.pipeline_schedule;
  in.micro_batches = micro_batches_;
  in.layers = layers_;
  for (std::size_t s = 0; s < stage_count; ++s)
    in.block.push_back(coefficients_[s]->block);
  in.head = coefficients_[stage_count - 1]->head;
  in.min_activation_link_seconds = link_patterns_.front().first;
  in.min_gradient_link_seconds = link_patterns_.front().second;
  for (const auto& [activation, gradient] : link_patterns_)
    for (std::size_t s = 0; s < stage_count; ++s) {
      in.min_activation_link_seconds[s] =
        std::min(in.min_activation_link_seconds[s], activation[s]);
      in.min_gradient_link_seconds[s] =
        std::min(in.min_gradient_link_seconds[s], gradient[s]);
    }
  auto last_min = eval(stages_ - 1, layers_with(stages_ - 1, 0));
  in.last_stage_min_optimizer_seconds = last_min.ok ? last_min.optimizer : 0;
  return in;
}

// The all-reduce bound of an option: every bucket of a chip's gradients
// crosses the ring edge into the chip 2 (R - 1) times, from a chip of another
// replica; at best the fastest such link, at least one bucket.
std::vector<inbound_link> inbound_links(planner::impl& impl,
                                        const pipeline_candidate& c) {
  const std::size_t group_count = c.groups.size();
  std::vector<inbound_link> out(group_count);
  for (std::size_t i = 0; i < group_count; ++i) {
    // The least favourable replica of the group: its bound holds for
    // every replica.
    inbound_link bound;
    bool first = true;
    for (std::size_t r = 0; r < c.groups[i].replicas.size(); ++r) {
      const chip_spec& me =
        *impl.chips[static_cast<std::size_t>(c.groups[i].replicas[r].front())];
      double latency = inf, seconds_per_byte = inf;
      for (std::size_t j = 0; j < group_count; ++j)
        for (std::size_t q = 0; q < c.groups[j].replicas.size(); ++q) {
          if (j == i && q == r)
            continue;
          for (int other : c.groups[j].replicas[q]) {
            auto l =
              impl.costs.link(*impl.chips[static_cast<std::size_t>(other)], me);
            latency = std::min(latency, l.time_scale * l.latency_seconds);
            seconds_per_byte =
              std::min(seconds_per_byte,
                       std::isinf(l.bandwidth_bytes_per_second)
                         ? 0.0
                         : l.time_scale / l.bandwidth_bytes_per_second);
          }
        }
      if (first || latency + seconds_per_byte <
                     bound.latency_seconds + bound.seconds_per_byte) {
        bound.latency_seconds = latency;
        bound.seconds_per_byte = seconds_per_byte;
        first = false;
      }
    }
    out[i] = bound;
  }
  return out;
}

double joint_option_bound(schedule_kind schedule, const inbound_link& inbound,
                          int replicas_total, double wire_ratio,
                          const group_solution& option) {
  double allreduce = 0;
  switch (schedule) {
    case schedule_kind::gpipe:
    case schedule_kind::one_f_one_b:
      allreduce = 2.0 * (replicas_total - 1) *
                  (inbound.latency_seconds +
                   option.first_gradient_bytes * wire_ratio / replicas_total *
                     inbound.seconds_per_byte);
      break;
    case schedule_kind::interleaved_1f1b:
    case schedule_kind::zb_h1:
    case schedule_kind::zb_hetero:
      break;
  }
  // A bound, so round it down a hair against floating-point noise.
  return (option.phase + allreduce + option.optimizer) * (1 - 1e-12);
}

} // namespace h2::scheduler::stage_two_detail
