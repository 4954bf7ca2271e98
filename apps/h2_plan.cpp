// h2-plan: HeteroAuto's plan of a job (docs/planner.md): the table of stages,
// the predicted step time and throughput and why; the plan as JSON for
// h2-launch --plan; the simulated step as a trace or an SVG timeline; a
// comparison with the even plan and the homogeneous sub-clusters.
#include "h2/apps/app.hpp"
#include "h2/runtime/auto_plan.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/metrics/trace.hpp"
#include "h2/scheduler/compare.hpp"
#include "h2/scheduler/planner.hpp"
#include "h2/scheduler/timeline_svg.hpp"

#include "h2/core/text.hpp"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

namespace {

using namespace h2;

struct options {
  std::string job_path;
  bool json = false;
  std::string trace;
  std::string svg;
  bool compare = false;
  bool candidates = false;
  std::string schedule;
  std::vector<int> micro_batch;
  std::string recompute = "selective";
  bool zero1 = false;
  int max_replicas = 0;
};

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

using scheduler::bytes_text;
using scheduler::seconds_text;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out)
    throw error("cannot write " + path);
}

void print_table(std::ostream& out, const scheduler::plan_report& r) {
  for (std::size_t ri = 0; ri < r.replicas.size(); ++ri) {
    const auto& rep = r.replicas[ri];
    out << "replica " << ri << ": " << rep.micro_batches << " micro-batches of "
        << rep.micro_batch_size << " sequence"
        << (rep.micro_batch_size == 1 ? "" : "s") << "\n";
    char line[256];
    std::snprintf(line, sizeof line,
                  "  %5s  %-6s %-26s %-11s %-20s %12s %12s %12s  %s\n", "stage",
                  "chip", "device", "layers", "recompute", "compute", "idle",
                  "optimizer", "memory (peak / capacity)");
    out << line;
    for (std::size_t s = 0; s < rep.stages.size(); ++s) {
      const auto& st = rep.stages[s];
      char layers[32];
      std::snprintf(layers, sizeof layers, "[%d, %d)", st.first_layer,
                    st.end_layer);
      std::snprintf(line, sizeof line,
                    "  %5zu  %-6s %-26s %-11s %-20s %12s %12s %12s  %s / %s\n",
                    s, st.chip.to_string().c_str(), st.device.c_str(), layers,
                    to_string(st.recompute).c_str(),
                    seconds_text(st.compute_seconds).c_str(),
                    seconds_text(st.idle_seconds).c_str(),
                    seconds_text(st.optimizer_seconds).c_str(),
                    bytes_text(st.peak_bytes).c_str(),
                    bytes_text(st.capacity_bytes).c_str());
      out << line;
    }
  }
  out << r.summary() << "\n";
}

/// Labels of the stages, "<chip> <profile>", per replica.
std::vector<std::vector<std::string>> labels_of(const job_config& job,
                                                const plan& p) {
  std::vector<std::vector<std::string>> out;
  for (const auto& r : p.replicas) {
    auto& row = out.emplace_back();
    for (const auto& s : r.stages)
      row.push_back(s.chip.to_string() + " " +
                    job.find_chip(s.chip)->profile.name);
  }
  return out;
}

void write_trace(const std::string& path, const job_config& job, const plan& p,
                 const scheduler::simulation& sim) {
  metrics::trace_writer trace;
  auto labels = labels_of(job, p);
  for (std::size_t r = 0; r < p.replicas.size(); ++r) {
    trace.name_process(static_cast<int>(r), "replica " + std::to_string(r));
    for (std::size_t s = 0; s < p.replicas[r].stages.size(); ++s)
      trace.name_thread(static_cast<int>(r), static_cast<int>(s),
                        "stage " + std::to_string(s) + ": " + labels[r][s]);
  }
  for (const auto& iv : sim.timeline) {
    std::string name(to_string(iv.kind));
    if (iv.micro_batch >= 0)
      name += " " + std::to_string(iv.micro_batch);
    nlohmann::json args = nlohmann::json::object();
    if (iv.micro_batch >= 0)
      args["micro_batch"] = iv.micro_batch;
    if (iv.chunk >= 0)
      args["chunk"] = iv.chunk;
    trace.complete(name, std::string(to_string(iv.kind)), iv.replica, iv.stage,
                   iv.start_seconds, iv.end_seconds - iv.start_seconds, args);
  }
  trace.write(path);
}

/// The super-linear ratio (docs/planner.md, "The super-linear ratio"), and
/// without the kinds that cannot train alone when some cannot.
void print_ratio(std::ostream& out, const scheduler::plan_report& best,
                 const scheduler::comparison& c) {
  if (c.homogeneous.size() < 2) {
    out << "super-linear ratio: n/a (one chip kind)\n";
    return;
  }
  if (c.super_linear_ratio <= 0) {
    out << "super-linear ratio: n/a (no kind can train the model alone)\n";
    return;
  }
  out << "super-linear ratio: auto / sum of homogeneous sub-clusters = "
      << fmt("%.0f", best.tokens_per_second) << " / "
      << fmt("%.0f", c.homogeneous_tokens_per_second) << " = "
      << fmt("%.4f", c.super_linear_ratio);
  if (!c.trainable) {
    out << " (every kind trains alone)\n";
    return;
  }
  out << " (kinds that cannot train alone count 0)\n";
  if (c.trainable->feasible)
    out << "  over the kinds that train alone: "
        << fmt("%.0f", c.trainable->tokens_per_second) << " / "
        << fmt("%.0f", c.homogeneous_tokens_per_second) << " = "
        << fmt("%.4f", c.trainable_ratio) << "\n";
  else
    out << "  over the kinds that train alone: n/a (their chips together: "
        << c.trainable->why_not << ")\n";
}

/// --compare: the even plan, each homogeneous sub-cluster planned alone
/// with its plan and what binds it, and the super-linear ratio.
void compare(std::ostream& out, const job_config& job,
             const scheduler::planner_options& opt,
             scheduler::chip_measurements& m,
             const scheduler::plan_report& best) {
  auto c = scheduler::compare_with_baselines(job, m, opt, best);
  char line[256];
  out << "compare (predicted):\n";
  std::snprintf(line, sizeof line, "  %-48s %12s %14s %8s\n", "plan", "step",
                "tokens/s", "vs auto");
  out << line;
  auto row = [&](const std::string& name, double step, double tps) {
    std::snprintf(line, sizeof line, "  %-48s %12s %14s %8s\n", name.c_str(),
                  seconds_text(step).c_str(), fmt("%.0f", tps).c_str(),
                  fmt("%.3f", tps / best.tokens_per_second).c_str());
    out << line;
  };
  row("auto (this plan)", best.step_seconds, best.tokens_per_second);
  if (c.even.feasible)
    row(c.even.name, c.even.step_seconds, c.even.tokens_per_second);
  else
    out << "  " << c.even.name << ": not possible (" << c.even.why_not << ")\n";
  for (const auto& h : c.homogeneous) {
    std::string name = "homogeneous " + h.name + " (" +
                       std::to_string(h.chips) + " chip" +
                       (h.chips == 1 ? "" : "s") + ", batch " +
                       std::to_string(h.global_batch) + ")";
    if (h.feasible) {
      row(name, h.step_seconds, h.tokens_per_second);
      out << "      plan: " << h.shape << "\n      binds: " << h.binding
          << "\n";
    } else {
      out << "  " << name << ": cannot train alone: " << h.why_not
          << "\n      lever: " << h.lever << "\n";
    }
  }
  if (c.trainable && c.trainable->feasible)
    row("mixed, the kinds that train alone (" +
          std::to_string(c.trainable->chips) + " chips)",
        c.trainable->step_seconds, c.trainable->tokens_per_second);
  print_ratio(out, best, c);
}

/// --compare: every schedule's own best plan.
void print_schedules(std::ostream& out,
                     const std::vector<scheduler::schedule_choice>& choices,
                     const scheduler::plan_report& best) {
  char line[256];
  out << "schedules (predicted, each planned by HeteroAuto):\n";
  std::snprintf(line, sizeof line, "  %-18s %12s %14s %8s %8s\n", "schedule",
                "step", "tokens/s", "bubble", "vs plan");
  out << line;
  for (const auto& c : choices) {
    const std::string name(to_string(c.schedule));
    if (!c.result) {
      out << "  " << name << ": nothing fits\n";
      continue;
    }
    const auto& r = c.result->report;
    std::snprintf(line, sizeof line, "  %-18s %12s %14s %7.1f%% %8s\n",
                  name.c_str(), seconds_text(r.step_seconds).c_str(),
                  fmt("%.0f", r.tokens_per_second).c_str(),
                  100.0 * r.bubble_fraction,
                  fmt("%.3f", r.tokens_per_second / best.tokens_per_second)
                    .c_str());
    out << line;
  }
}

/// Schedule "auto" and no schedule fits: 1F1B's reasons, as a plan of a
/// fixed schedule would give them.
int failed_search(const std::vector<scheduler::schedule_choice>& choices) {
  for (const auto& c : choices)
    if (c.schedule == schedule_kind::one_f_one_b)
      std::rethrow_exception(c.error);
  std::rethrow_exception(choices.front().error);
}

int run(const options& opt) {
  job_config job = load_job_file(opt.job_path);
  job.plan.zero1 = job.plan.zero1 || opt.zero1;
  scheduler::planner_options po;
  if (opt.schedule == "auto") {
    po.search_schedules = true;
  } else if (!opt.schedule.empty()) {
    auto k = parse_schedule_kind(opt.schedule);
    if (!k)
      throw config_error("", "--schedule: expected one of " +
                               schedule_kind_choices() + ", \"auto\", got \"" +
                               printable(opt.schedule) + "\"");
    po.schedule = *k;
  }
  po.micro_batch_sizes = opt.micro_batch;
  auto levels = scheduler::parse_recompute_levels(opt.recompute);
  if (!levels)
    throw config_error("", "--recompute: expected none, full or selective, "
                           "got \"" +
                             printable(opt.recompute) + "\"");
  po.recompute = *levels;
  po.max_replicas = opt.max_replicas;
  po.rank_candidates = opt.candidates;

  runtime::profiled_measurements m(job);
  auto t0 = std::chrono::steady_clock::now();
  // Every schedule, planned alone: to choose one (schedule "auto") or to
  // compare them (--compare).
  const bool search = scheduler::searches_schedules(job, po);
  std::vector<scheduler::schedule_choice> choices;
  if (search || opt.compare)
    choices = scheduler::plan_each_schedule(job, m, po);
  if (search) {
    if (!choices.front().result)
      return failed_search(choices);
    po.schedule = choices.front().schedule;
  }
  scheduler::planner pl(job, m, po);
  auto result =
    search ? *choices.front().result : scheduler::plan_auto(job, m, po);
  double planning =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
  const bool drawings = !opt.trace.empty() || !opt.svg.empty();
  auto report = drawings ? pl.evaluate(result.value, true) : result.report;
  if (drawings) {
    // Keep the search statistics of the planning run.
    auto keep = result.report;
    keep.sim = std::move(report.sim);
    report = std::move(keep);
  }
  if (!opt.trace.empty())
    write_trace(opt.trace, job, result.value, report.sim);
  if (!opt.svg.empty())
    write_file(opt.svg,
               scheduler::render_svg(
                 report.sim, labels_of(job, result.value),
                 "h2-plan: " + printable(job.name) + ", predicted step " +
                   seconds_text(report.step_seconds) + ", " +
                   fmt("%.0f", report.tokens_per_second) + " tokens/s"));
  if (opt.json) {
    std::cout << to_json(result.value) << std::endl;
    return apps::exit_ok;
  }
  std::map<std::string, int> kinds;
  for (const auto* c : pl.chips())
    ++kinds[c->profile.name];
  std::cout << "h2-plan: job \"" << printable(job.name)
            << "\": " << model_parameters(job.model) << "-parameter "
            << display_name(job.model.family) << ", " << job.model.num_layers()
            << " layers, " << to_string(pl.schedule()) << ", "
            << pl.chips().size() << " chip"
            << (pl.chips().size() == 1 ? "" : "s") << " of " << kinds.size()
            << " kind" << (kinds.size() == 1 ? "" : "s") << ", global batch "
            << job.train.global_batch << " x " << job.model.seq_len
            << " tokens\n";
  std::cout << "h2-plan: planned in " << fmt("%.2f", planning) << " s\n";
  print_table(std::cout, report);
  std::cout << "why:\n";
  std::istringstream why(report.explain());
  for (std::string line; std::getline(why, line);)
    std::cout << "  " << line << "\n";
  if (opt.candidates) {
    std::cout << "layouts (stage 1), fastest first:\n";
    for (const auto& c : report.ranking)
      std::cout << "  " << (c.feasible ? seconds_text(c.step_seconds) : "   -")
                << (c.feasible && !c.proven_optimal ? " (best found)" : "")
                << (c.feasible ? "" : " does not fit") << "  " << c.shape
                << "\n";
  }
  if (opt.compare) {
    print_schedules(std::cout, choices, report);
    compare(std::cout, job, po, m, report);
  }
  std::cout.flush();
  return apps::exit_ok;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  CLI::App cli{"Plan a job with HeteroAuto: which chips form which stages, "
               "which layers each holds, micro-batching, recomputation; "
               "with the simulator's prediction."};
  cli.add_option("job", opt.job_path, "Job file (TOML)")
    ->required()
    ->check(CLI::ExistingFile);
  cli.add_flag("--json", opt.json,
               "Print only the plan, as JSON (h2-launch --plan accepts it)");
  cli.add_option("--trace", opt.trace,
                 "Write the simulated step as a Chrome/Perfetto trace to FILE");
  cli.add_option("--svg", opt.svg,
                 "Draw the simulated step's pipeline timeline as SVG to FILE");
  cli.add_flag("--compare", opt.compare,
               "Also predict the even plan and every chip kind alone, and "
               "the super-linear ratio");
  cli.add_flag("--candidates", opt.candidates,
               "Also list every stage-1 layout with its own best step time "
               "(slower: each is solved to its optimum)");
  cli.add_option("--schedule", opt.schedule,
                 "gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-hetero, or auto: "
                 "plan each and keep the fastest (default: plan.schedule of "
                 "the job)");
  cli
    .add_option("--micro-batch", opt.micro_batch,
                "Allowed micro-batch sizes (default: every divisor)")
    ->check(CLI::Range(1, 1 << 30));
  cli.add_option("--recompute", opt.recompute,
                 "What stages may recompute: none, full (whole stages "
                 "only) or selective (also whole blocks and attention "
                 "cores; default)");
  cli.add_flag("--zero1", opt.zero1,
               "Shard the AdamW moments over the replicas (ZeRO-1), as "
               "[plan] zero1 = true does");
  cli
    .add_option("--max-replicas", opt.max_replicas,
                "Most data-parallel replicas (default: no limit)")
    ->check(CLI::Range(1, 1 << 20));
  return apps::run_app("h2-plan", [&] {
    try {
      cli.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) // --help
        return cli.exit(e);
      throw config_error("", std::string(e.what()) + " (see --help)");
    }
    return run(opt);
  });
}
