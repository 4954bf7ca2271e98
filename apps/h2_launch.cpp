// h2-launch: runs a job. In one process by default (every chip an actor,
// in-process channels), or with --nodes N as N local h2-node processes
// talking over shm/tcp. Progress, metrics, JSON log, trace. docs/cli.md.
#include "h2/actors/errors.hpp"
#include "h2/actors/local_job.hpp"
#include "h2/apps/endpoints.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/apps/launcher.hpp"
#include "h2/apps/opcheck.hpp"
#include "h2/apps/reporter.hpp"
#include "h2/apps/session.hpp"
#include "h2/apps/signals.hpp"

#include <algorithm>
#include <iostream>

namespace {

using namespace h2;

int run_in_process(const std::string& job_path, const apps::run_flags& f) {
  // From the start: a signal while a checkpoint loads ends the run too.
  apps::signal_watcher signals(nullptr);
  auto setting_up = signals.exiting("h2-launch");
  auto job = apps::load_job(job_path, f);
  apps::print_cpu_bf16("h2", job->chips(), std::cout);
  if (job->ditorch.check)
    if (int rc =
          apps::check_chip_operators("h2-launch", *job, job->chips(),
                                     apps::opcheck_options_of(*job), std::cout);
        rc != apps::exit_ok)
      return rc;
  auto chosen = apps::choose_plan(f, *job);
  auto resume =
    apps::resume_from(f, *job, chosen.value, apps::job_text(job_path));
  actors::local_job local(job, chosen.value);
  runtime::run_view view(*job, job->train.steps);
  apps::run_endpoints endpoints(*job, f, {.page = &view}, "h2");

  apps::reporter_options ro;
  ro.total_steps = job->train.steps;
  ro.quiet = f.quiet;
  ro.json_log = f.json_log;
  ro.trace = f.trace;
  ro.predicted_step_seconds = chosen.predicted_step_seconds;
  apps::reporter reporter(*job, ro, endpoints.registry());
  runtime::observer_fanout observers({&reporter, &view});

  actors::run_options run;
  run.steps = f.stop_after > 0 ? std::min(f.stop_after, job->train.steps)
                               : job->train.steps;
  run.collect_parameters = !f.export_path.empty();
  run.resume = std::move(resume);
  run.job_text = apps::job_text(job_path);
  run.replans = apps::replans_from(f, *job);
  run.admin = endpoints.inbox();
  setting_up.reset();
  const auto abort_local = signals.aborting([&local] { local.abort(); });
  runtime::run_summary summary;
  try {
    summary = local.run(run, observers, signals.stop_flag());
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
  view.finish(summary);
  if (!f.export_path.empty()) {
    apps::write_safetensors(f.export_path, local.parameters(), job->name);
    std::cout << "h2: parameters written to " << f.export_path << std::endl;
  }
  if (summary.stopped_early && signals.signal() != 0)
    return apps::exit_signal_base + signals.signal();
  return apps::exit_ok;
}

} // namespace

int main(int argc, char** argv) {
  apps::block_stop_signals();
  apps::launch_options o;
  CLI::App cli{"Train a GPT on a heterogeneous cluster: in one process (every "
               "chip an actor), or with --nodes N as N local h2-node "
               "processes. Without JOB, runs the built-in demo."};
  cli.add_option("job", o.job_path, "Job file (TOML)")
    ->check(CLI::ExistingFile);
  cli
    .add_option("--nodes", o.nodes,
                "Run as N local h2-node processes (the job must declare N "
                "[[nodes]])")
    ->check(CLI::Range(1, 4096));
  cli.add_option("--metrics-targets", o.targets_file,
                 "With --nodes: the Prometheus file_sd targets file to "
                 "write (default: h2-prometheus-targets.json)");
  apps::add_run_flags(cli, o.flags);
  return apps::parse_and_run(cli, argc, argv, "h2-launch", [&] {
    if (cli.count("--nodes") == 0)
      return run_in_process(o.job_path, o.flags);
    o.node_binary = apps::sibling_binary("h2-node");
    return apps::launch_nodes(o);
  });
}
