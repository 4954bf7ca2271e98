#include "h2/runtime/host_pace.hpp"

#include <cstdio>

namespace h2::runtime {

host_pace_watch::host_pace_watch(int warmup_steps, int window_steps,
                                 double tolerance)
    : warmup_steps_(warmup_steps), window_steps_(window_steps),
      tolerance_(tolerance) {}

std::optional<std::string> host_pace_watch::observe(const step_summary& s) {
  const chip_step_stats* worst = nullptr;
  step_pace worst_sum;
  for (const auto& c : s.chips) {
    auto& last = last_overrun_seconds_[c.chip];
    step_pace p;
    p.over = c.overrun_seconds - last;
    last = c.overrun_seconds;
    // The op times of a wall-clock step include their overruns.
    p.charged =
      c.forward_seconds + c.backward_seconds + c.optimizer_seconds - p.over;
    if (s.step < warmup_steps_)
      continue;
    auto& window = window_[c.chip];
    window.push_back(p);
    if (static_cast<int>(window.size()) > window_steps_)
      window.pop_front();
    if (static_cast<int>(window.size()) < window_steps_)
      continue;
    step_pace sum;
    for (const auto& w : window) {
      sum.over += w.over;
      sum.charged += w.charged;
    }
    if (sum.charged <= 0 || sum.over <= tolerance_ * sum.charged)
      continue;
    if (!worst ||
        sum.over / sum.charged > worst_sum.over / worst_sum.charged) {
      worst = &c;
      worst_sum = sum;
    }
  }
  if (said_ || !worst)
    return std::nullopt;
  said_ = true;
  char line[400];
  std::snprintf(line, sizeof(line),
                "the host CPU cannot keep up with chip %s: over steps %d-%d "
                "its math took %.2fx the %.3f s its profile charges (%.3f s "
                "over); step times show this host, not the chips, and "
                "rebalancing cannot help. Raise [emulation] time_scale or "
                "shrink the model (docs/emulation.md)",
                worst->chip.to_string().c_str(), s.step + 2 - window_steps_,
                s.step + 1,
                (worst_sum.charged + worst_sum.over) / worst_sum.charged,
                worst_sum.charged, worst_sum.over);
  return std::string(line);
}

} // namespace h2::runtime
