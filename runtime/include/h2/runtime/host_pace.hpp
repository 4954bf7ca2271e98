// Whether the host CPU keeps up with the emulated chips (docs/emulation.md,
// "When the host cannot keep up"). Under the wall clock a chip waits out
// the time its profile charges for an op; when the host's own math takes
// longer, the op overruns and steps show the host, not the chips -- and a
// rebalance planned from the charged times cannot make them faster. The
// watch turns the chips' overrun figures into one line naming the chip that
// overran most over a window of steps (one noisy step of a shared machine
// is not a host that cannot keep up), said once per run. Pure arithmetic
// over step summaries.
#pragma once

#include "h2/runtime/step_summary.hpp"

#include <deque>
#include <map>
#include <optional>
#include <string>

namespace h2::runtime {

class host_pace_watch {
public:
  /// Steps before `warmup_steps` are not judged (allocator and thread-pool
  /// warm-up); a chip is behind when, over its last `window_steps` steps,
  /// its overruns add more than `tolerance` of the time it was charged.
  explicit host_pace_watch(int warmup_steps = 3, int window_steps = 5,
                           double tolerance = 0.10);

  /// Takes a step's summary. Returns the warning the first time a chip is
  /// behind; nothing before, after, or under the virtual clock (where no
  /// chip overruns).
  std::optional<std::string> observe(const step_summary& s);

private:
  /// A chip's overrun and charged seconds in one step.
  struct step_pace {
    double over = 0;
    double charged = 0;
  };

  int warmup_steps_;
  int window_steps_;
  double tolerance_;
  bool said_ = false;
  std::map<chip_id, double> last_overrun_seconds_; ///< cumulative, per chip
  std::map<chip_id, std::deque<step_pace>> window_; ///< judged steps only
};

} // namespace h2::runtime
