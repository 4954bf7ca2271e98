// Reports a run as users of a trainer expect: one progress line per step, a
// summary at the end, optionally a JSON log (one object per line), a
// Chrome/Perfetto trace of every chip's ops, and Prometheus metrics.
#pragma once

#include "h2/runtime/host_pace.hpp"
#include "h2/runtime/observer.hpp"
#include "h2/core/job.hpp"
#include "h2/metrics/registry.hpp"
#include "h2/metrics/trace.hpp"

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace h2::apps {

struct reporter_options {
  int total_steps = 0;
  bool quiet = false;      ///< no step or eval lines (the summary prints)
  std::string json_log;    ///< "" for none
  std::string trace;       ///< "" for none
  std::FILE* out = stdout; ///< where progress and the summary go
  /// HeteroAuto's predicted step time (plan.mode = "auto"): exported as
  /// h2_predicted_step_seconds and set beside the measured one at the end.
  std::optional<double> predicted_step_seconds;
  /// Times the job was restarted on its surviving chips before this run
  /// (h2-launch --nodes with [restart]): exported as h2_restarts_total;
  /// above 0 the JSON log is appended to, after a "restart" event.
  int restarts = 0;
};

class reporter final : public runtime::training_observer {
public:
  /// `registry` may be null (no metrics). Opens the JSON log; throws
  /// h2::error naming the path when it cannot.
  reporter(const job_config& job, reporter_options options,
           metrics::registry* registry);

  void on_setup(const plan& p,
                const std::vector<runtime::setup_report>& chips) override;
  void on_step(const runtime::step_summary& s) override;
  void on_eval(int step, double val_loss) override;
  void on_checkpoint(int steps, double waited_seconds,
                     double stall_seconds) override;
  void on_rebalance(const runtime::rebalance_event& e) override;

  /// Prints the summary and writes the trace (if asked for).
  void finish(const runtime::run_summary& summary);

private:
  /// Labels of a chip's metrics: chip, profile, vendor, node, stage.
  metrics::label_set chip_labels(const chip_id& id, int stage) const;
  void update_metrics(const runtime::step_summary& s);
  void trace_step(const runtime::step_summary& s);

  const job_config& job_;
  reporter_options options_;
  metrics::registry* registry_;
  std::ofstream json_;
  std::unique_ptr<metrics::trace_writer> trace_;
  std::map<chip_id, int> stage_of_;
  runtime::host_pace_watch host_pace_; ///< says once if the host lags
};

} // namespace h2::apps
