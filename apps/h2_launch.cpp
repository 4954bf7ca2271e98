// h2-launch: runs a job in one process (every chip an actor, in-process
// channels), with progress, metrics, JSON log and trace. docs/cli.md.
#include "h2/actors/errors.hpp"
#include "h2/actors/local_job.hpp"
#include "h2/apps/app.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/apps/reporter.hpp"
#include "h2/apps/signals.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/metrics/http_server.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

namespace {

using namespace h2;

struct options {
  std::string job_path; ///< empty: the built-in demo
  int steps = 0;        ///< 0: the job's train.steps
  std::string json_log;
  std::string trace;
  std::string plan_path;
  int metrics_port = -1; ///< -1: the job's metrics.port
  bool no_metrics = false;
  bool quiet = false;
};

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error("", path + ": cannot open " + what);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int launch(const options& opt) {
  auto job = std::make_shared<job_config>(
    opt.job_path.empty() ? parse_job(demo_job_toml(), "built-in demo.toml")
                         : load_job_file(opt.job_path));
  if (opt.steps > 0)
    job->train.steps = opt.steps;
  plan p;
  if (!opt.plan_path.empty()) {
    p = plan_from_json(read_file(opt.plan_path, "plan file"), opt.plan_path);
    validate_plan(p, *job, opt.plan_path);
  } else {
    p = scheduler::make_plan(*job);
  }
  actors::local_job local(job, p);

  metrics::registry registry;
  std::unique_ptr<metrics::http_server> server;
  int port = opt.metrics_port >= 0 ? opt.metrics_port : job->metrics.port;
  bool serve = !opt.no_metrics && (opt.metrics_port >= 0 || port > 0);
  if (serve) {
    try {
      server = std::make_unique<metrics::http_server>(
        job->metrics.bind, static_cast<std::uint16_t>(port),
        [&registry] { return registry.expose(); });
    } catch (const h2::error& e) {
      throw config_error("metrics.port", std::string(e.what()) +
                                           " (choose another with "
                                           "--metrics-port, or --no-metrics)");
    }
    std::cout << "h2: metrics at http://" << job->metrics.bind << ":"
              << server->port() << "/metrics" << std::endl;
  }

  apps::reporter_options ro;
  ro.total_steps = job->train.steps;
  ro.quiet = opt.quiet;
  ro.json_log = opt.json_log;
  ro.trace = opt.trace;
  apps::reporter reporter(*job, ro, serve ? &registry : nullptr);

  apps::signal_watcher signals([&local] { local.abort(); });
  actors::run_summary summary;
  try {
    summary =
      local.run({job->train.steps, false}, reporter, signals.stop_flag());
  } catch (const actors::run_error& e) {
    // The abort closes every channel: chips see their own end closed
    // (cancelled) or their neighbour's (peer_lost, which root_cause ranks
    // first). Either is the abort, not a failure of training.
    bool aborted = signals.stop_flag()->load() >= 2 &&
                   (e.code() == actors::errc::cancelled ||
                    e.code() == actors::errc::peer_lost);
    if (aborted) {
      std::cerr << "h2-launch: aborted by signal " << signals.signal()
                << std::endl;
      return apps::exit_signal_base + signals.signal();
    }
    throw;
  }
  reporter.finish(summary);
  if (summary.stopped_early)
    return apps::exit_signal_base + signals.signal();
  return apps::exit_ok;
}

} // namespace

int main(int argc, char** argv) {
  apps::block_stop_signals();
  options opt;
  CLI::App cli{"Train a GPT on a heterogeneous cluster in one process (every "
               "chip an actor). Without JOB, runs the built-in demo."};
  cli.add_option("job", opt.job_path, "Job file (TOML)")
    ->check(CLI::ExistingFile);
  cli.add_option("--steps", opt.steps, "Steps to train (default: train.steps)")
    ->check(CLI::Range(1, 1 << 30));
  cli.add_option("--json-log", opt.json_log,
                 "Write one JSON object per step (and eval) to FILE");
  cli.add_option("--trace", opt.trace,
                 "Write the run's per-chip timeline as a Chrome/Perfetto "
                 "trace to FILE");
  cli.add_option("--plan", opt.plan_path,
                 "Use this plan (JSON, as h2-plan --json prints) instead of "
                 "the job's [plan]");
  cli
    .add_option("--metrics-port", opt.metrics_port,
                "Serve /metrics on this port (0: any free port; default: "
                "metrics.port of the job)")
    ->check(CLI::Range(0, 65535));
  cli.add_flag("--no-metrics", opt.no_metrics, "Serve no metrics");
  cli.add_flag("-q,--quiet", opt.quiet, "No per-step progress lines");
  return apps::run_app("h2-launch", [&] {
    try {
      cli.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) // --help
        return cli.exit(e);
      // One line like every other bad input (CLI11's own report adds a
      // second line, "Run with --help ...").
      throw config_error("", std::string(e.what()) + " (see --help)");
    }
    return launch(opt);
  });
}
