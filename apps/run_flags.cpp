#include "h2/apps/run_flags.hpp"

#include <iomanip>
#include <limits>
#include <sstream>

namespace h2::apps {

namespace {

void text(std::vector<std::string>& out, const char* name,
          const std::string& value) {
  if (!value.empty())
    out.insert(out.end(), {name, value});
}

void positive(std::vector<std::string>& out, const char* name, int value) {
  if (value > 0)
    out.insert(out.end(), {name, std::to_string(value)});
}

/// --steps and what the run writes: --json-log, --trace, --plan,
/// --export.
std::vector<run_flag> steps_and_outputs() {
  using reach = flag_reach;
  using argv = std::vector<std::string>;
  return {
    {"--steps", reach::every_node,
     [](CLI::App& cli, run_flags& f) {
       cli
         .add_option("--steps", f.steps,
                     "Steps to train (default: train.steps)")
         ->check(CLI::Range(1, 1 << 30));
     },
     [](const run_flags& f, argv& out) {
       positive(out, "--steps", f.steps);
     }},
    {"--json-log", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_option("--json-log", f.json_log,
                      "Write one JSON object per step (and eval) to FILE");
     },
     [](const run_flags& f, argv& out) {
       text(out, "--json-log", f.json_log);
     }},
    {"--trace", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_option("--trace", f.trace,
                      "Write the run's per-chip timeline as a Chrome/Perfetto "
                      "trace to FILE");
     },
     [](const run_flags& f, argv& out) {
       text(out, "--trace", f.trace);
     }},
    {"--plan", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_option("--plan", f.plan_path,
                      "Use this plan (JSON, as h2-plan --json prints) instead "
                      "of the job's [plan]");
     },
     [](const run_flags& f, argv& out) {
       text(out, "--plan", f.plan_path);
     }},
    {"--export", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_option("--export", f.export_path,
                      "Write the trained parameters to FILE (safetensors)");
     },
     [](const run_flags& f, argv& out) {
       text(out, "--export", f.export_path);
     }},
  };
}

/// What the run serves, and its progress lines: --metrics-port,
/// --no-metrics, --admin-port, --quiet.
std::vector<run_flag> serving_flags() {
  using reach = flag_reach;
  using argv = std::vector<std::string>;
  return {
    {"--metrics-port", reach::per_node,
     [](CLI::App& cli, run_flags& f) {
       cli
         .add_option("--metrics-port", f.metrics_port,
                     "Serve /metrics on this port (0: any free port; default: "
                     "metrics.port of the job)")
         ->check(CLI::Range(0, 65535));
     },
     [](const run_flags& f, argv& out) {
       if (f.metrics_port >= 0)
         out.insert(out.end(),
                    {"--metrics-port", std::to_string(f.metrics_port)});
     }},
    {"--no-metrics", reach::per_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_flag("--no-metrics", f.no_metrics, "Serve no metrics");
     },
     [](const run_flags& f, argv& out) {
       if (f.no_metrics)
         out.push_back("--no-metrics");
     }},
    {"--admin-port", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli
         .add_option("--admin-port", f.admin_port,
                     "Serve the admin endpoint on this port (0: any free "
                     "port; default: admin.port of the job; needs "
                     "admin.token_file)")
         ->check(CLI::Range(0, 65535));
     },
     [](const run_flags& f, argv& out) {
       if (f.admin_port >= 0)
         out.insert(out.end(), {"--admin-port", std::to_string(f.admin_port)});
     }},
    {"--quiet", reach::every_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_flag("-q,--quiet", f.quiet, "No per-step progress lines");
     },
     [](const run_flags& f, argv& out) {
       if (f.quiet)
         out.push_back("--quiet");
     }},
  };
}

/// Where the run starts and ends: --stop-after, --resume, --init-from,
/// --replan, --join-timeout.
std::vector<run_flag> start_and_end_flags() {
  using reach = flag_reach;
  using argv = std::vector<std::string>;
  return {
    {"--stop-after", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli
         .add_option("--stop-after", f.stop_after,
                     "End cleanly after step N (saving a checkpoint with "
                     "[checkpoint]) without changing train.steps")
         ->check(CLI::Range(1, 1 << 30));
     },
     [](const run_flags& f, argv& out) {
       positive(out, "--stop-after", f.stop_after);
     }},
    {"--resume", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_option("--resume", f.resume,
                      "Continue from a checkpoint: its directory, or 'latest' "
                      "(the newest complete one under checkpoint.dir)");
     },
     [](const run_flags& f, argv& out) {
       text(out, "--resume", f.resume);
     }},
    {"--init-from", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_option(
         "--init-from", f.init_from,
         "Start from a Hugging Face model directory (LlamaForCausalLM or "
         "GPT2LMHeadModel, e.g. from h2-export --format hf): its weights, a "
         "fresh optimizer, step 0. Saved as step 0 under checkpoint.dir when "
         "the job has one (--nodes needs it)");
     },
     [](const run_flags& f, argv& out) {
       text(out, "--init-from", f.init_from);
     }},
    {"--replan", reach::coordinator_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_option("--replan", f.replans,
                      "STEP:PLAN.json: before step STEP, move the running job "
                      "to this plan (the same chips in the same order: other "
                      "layer boundaries, micro-batching, recomputation); "
                      "repeatable. A drill of live rebalancing "
                      "(docs/rebalance.md)");
     },
     [](const run_flags& f, argv& out) {
       for (const auto& r : f.replans)
         out.insert(out.end(), {"--replan", r});
     }},
    {"--join-timeout", reach::every_node,
     [](CLI::App& cli, run_flags& f) {
       cli.add_option("--join-timeout", f.join_timeout_seconds,
                      "SECONDS: with several processes, how long the "
                      "coordinator waits for every node to join and a node "
                      "tries to reach it (default: "
                      "cluster.join_timeout_seconds, 300)");
     },
     [](const run_flags& f, argv& out) {
       if (!f.join_timeout_seconds)
         return;
       std::ostringstream seconds; // every bit of the double
       seconds << std::setprecision(std::numeric_limits<double>::max_digits10)
               << *f.join_timeout_seconds;
       out.insert(out.end(), {"--join-timeout", seconds.str()});
     }},
  };
}

/// The flags, in the order --help lists them.
std::vector<run_flag> make_table() {
  std::vector<run_flag> all = steps_and_outputs();
  for (auto group : {serving_flags(), start_and_end_flags()})
    all.insert(all.end(), group.begin(), group.end());
  return all;
}

} // namespace

const std::vector<run_flag>& run_flag_table() {
  static const std::vector<run_flag> table = make_table();
  return table;
}

void add_run_flags(CLI::App& cli, run_flags& flags) {
  for (const auto& flag : run_flag_table())
    flag.add(cli, flags);
}

std::vector<std::string> run_flags_argv(const run_flags& flags,
                                        bool coordinator_node) {
  std::vector<std::string> out;
  for (const auto& flag : run_flag_table())
    if (flag.reach == flag_reach::every_node ||
        (flag.reach == flag_reach::coordinator_node && coordinator_node))
      flag.argv(flags, out);
  return out;
}

} // namespace h2::apps
