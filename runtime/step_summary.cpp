#include "h2/runtime/step_summary.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

namespace h2::runtime {

double grad_norm_of(const std::vector<chip_step_report>& steps) {
  // Summed in layer order, as the single model sums them. After the
  // all-reduce every replica holds the same gradient: replica 0's layers
  // are the whole model. Under ZeRO-1 each replica holds a share of each
  // layer's: summed replica by replica within a layer.
  std::vector<std::tuple<std::int32_t, int, double>> layers;
  for (const auto& r : steps)
    if (r.replica == 0 || r.norm_shares) {
      H2_ENFORCE(r.layer_ids.size() == r.layer_squared_norms.size(), "chip ",
                 r.chip.to_string(), ": ", r.layer_ids.size(),
                 " layer ids for ", r.layer_squared_norms.size(), " norms");
      for (std::size_t i = 0; i < r.layer_ids.size(); ++i)
        layers.emplace_back(r.layer_ids[i], r.replica,
                            r.layer_squared_norms[i]);
    }
  std::sort(layers.begin(), layers.end());
  double sum = 0;
  for (const auto& [layer, replica, s] : layers)
    sum += s;
  return std::sqrt(sum);
}

double virtual_phase_end(const std::vector<chip_step_report>& steps) {
  double t = 0;
  for (const auto& r : steps)
    t = std::max(t, r.phase_end.virtual_seconds);
  return t;
}

step_summary summarize_step(int step, clock_mode clock, std::int64_t tokens,
                            double lr, double grad_norm,
                            double clip_coefficient,
                            const std::vector<chip_step_report>& steps,
                            const std::vector<chip_update_report>& updates) {
  H2_ENFORCE(!steps.empty() && steps.size() == updates.size(),
             "steps=", steps.size(), " updates=", updates.size());
  const bool wall = clock == clock_mode::wall;
  auto run = [&](const clock_pair& c) {
    return wall ? c.wall_seconds : c.virtual_seconds;
  };
  constexpr double inf = std::numeric_limits<double>::infinity();
  double start_v = inf, start_w = inf, phase_end = 0, end_v = 0, end_w = 0;
  for (const auto& r : steps) {
    start_v = std::min(start_v, r.start.virtual_seconds);
    start_w = std::min(start_w, r.start.wall_seconds);
    phase_end = std::max(phase_end, run(r.phase_end));
  }
  for (const auto& u : updates) {
    end_v = std::max(end_v, u.end.virtual_seconds);
    end_w = std::max(end_w, u.end.wall_seconds);
  }
  step_summary s;
  s.step = step;
  s.lr = lr;
  s.grad_norm = grad_norm;
  s.clip_coefficient = clip_coefficient;
  s.virtual_step_seconds = end_v - start_v;
  s.wall_step_seconds = end_w - start_w;
  s.step_seconds = wall ? s.wall_step_seconds : s.virtual_step_seconds;
  s.pipeline_seconds = phase_end - (wall ? start_w : start_v);
  s.virtual_end = end_v;
  s.wall_start = start_w;
  s.wall_end = end_w;
  s.tokens_per_second =
    s.step_seconds > 0 ? static_cast<double>(tokens) / s.step_seconds : 0;
  std::map<chip_id, const chip_update_report*> update_of;
  for (const auto& u : updates)
    update_of[u.chip] = &u;
  double busy = 0;
  for (const auto& r : steps) {
    s.loss += r.loss;
    chip_step_stats c;
    c.chip = r.chip;
    c.replica = r.replica;
    c.stage = r.stage;
    c.forward_seconds = r.forward_seconds;
    c.backward_seconds = r.backward_seconds;
    c.idle_seconds = std::max(0.0, s.pipeline_seconds - r.forward_seconds -
                                     r.backward_seconds);
    busy += r.forward_seconds + r.backward_seconds;
    c.memory = r.memory;
    c.traffic = r.traffic;
    c.overruns = r.overruns;
    c.overrun_seconds = r.overrun_seconds;
    auto u = update_of.find(r.chip);
    H2_ENFORCE(u != update_of.end(), "no update report of chip ",
               r.chip.to_string());
    c.optimizer_seconds = u->second->optimizer_seconds;
    c.memory.used = u->second->memory.used;
    c.memory.peak = std::max(c.memory.peak, u->second->memory.peak);
    s.chips.push_back(c);
    for (const auto& op : r.ops)
      s.ops.push_back({r.chip, op});
    s.ops.push_back({r.chip, u->second->op});
  }
  std::sort(s.chips.begin(), s.chips.end(),
            [](const auto& a, const auto& b) { return a.chip < b.chip; });
  double capacity = s.pipeline_seconds * static_cast<double>(steps.size());
  s.bubble_fraction = capacity > 0 ? std::max(0.0, 1.0 - busy / capacity) : 0;
  return s;
}

} // namespace h2::runtime
