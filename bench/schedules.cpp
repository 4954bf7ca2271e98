// Pipeline schedules on the wall clock (docs/planner.md, "Schedules").
// 1. The demo cluster: HeteroAuto planned once per schedule this version
//    runs; the best plan over all schedules against the best 1F1B plan, each
//    trained 12 steps under the wall clock (the first 2 left out), with
//    each chip's bubble.
// 2. Four identical chips, even stages, 8 micro-batches: interleaved-1f1b
//    (2 chunks per chip), zb-h1 and zb-hetero (2 chunks per chip, its
//    greedy lists) against 1f1b under the wall clock, the measured bubble
//    against the simulator and the textbook value (which assumes F = B = W
//    and free links; ZB-H1's for zb-hetero).
// 3. examples/cluster-1024.toml: each schedule's predicted step and
//    planning time.
// With --svg DIR it also draws the textbook timelines of docs/planner.md
// ("Schedules"): four identical chips, 8 micro-batches, F = 1, B = W = 1
// (fused backward 2), free links.
#include "bench_common.hpp"

#include "h2/actors/local_job.hpp"
#include "h2/core/error.hpp"
#include "h2/core/job.hpp"
#include "h2/runtime/auto_plan.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "h2/scheduler/planner.hpp"
#include "h2/scheduler/schedule.hpp"
#include "h2/scheduler/simulator.hpp"
#include "h2/scheduler/timeline_svg.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

using namespace h2;

namespace {

/// Steps [skip, steps) of `p` trained on `job`: mean step seconds, mean
/// bubble, and each chip's mean idle share of the pipeline phase.
struct measured_run {
  double step_seconds = 0;
  double bubble = 0;
  std::string chips; ///< "0:0 12.3%, 0:1 ..."
  /// Ops whose host computation outlasted their emulated time, and by how
  /// much, per step (wall clock).
  double overruns = 0, overrun_seconds = 0;
};

measured_run run(std::shared_ptr<const job_config> job, const plan& p,
                 int steps, int skip) {
  actors::local_job local(std::move(job), p);
  runtime::step_recorder rec;
  local.run({steps, false}, rec);
  measured_run out;
  std::map<chip_id, double> idle;
  for (int i = skip; i < steps; ++i) {
    const auto& s = rec.steps[static_cast<std::size_t>(i)];
    out.step_seconds += s.step_seconds / (steps - skip);
    out.bubble += s.bubble_fraction / (steps - skip);
    for (const auto& c : s.chips)
      idle[c.chip] += c.idle_seconds / s.pipeline_seconds / (steps - skip);
  }
  for (const auto& c : rec.steps.back().chips) {
    out.overruns += static_cast<double>(c.overruns) / steps;
    out.overrun_seconds += c.overrun_seconds / steps;
  }
  char buf[64];
  for (const auto& [chip, share] : idle) {
    std::snprintf(buf, sizeof buf, "%s%s %.1f%%", out.chips.empty() ? "" : ", ",
                  chip.to_string().c_str(), 100 * share);
    out.chips += buf;
  }
  return out;
}

std::shared_ptr<job_config> without_extras(const job_config& job) {
  auto out = std::make_shared<job_config>(job);
  out->metrics.port = 0;
  out->rebalance = rebalance_config{}; // each plan as it is
  out->drills.clear();
  return out;
}

/// Part 1: the demo cluster.
void demo_cluster(std::vector<bench::record>& records) {
  auto job = without_extras(parse_job(demo_job_toml(), "demo.toml"));
  job->plan.mode = plan_mode::automatic;
  runtime::profiled_measurements m(*job);
  auto choices = scheduler::plan_each_schedule(*job, m);
  const scheduler::planned* one_f_one_b = nullptr;
  for (const auto& c : choices) {
    if (c.result && c.schedule == schedule_kind::one_f_one_b)
      one_f_one_b = &*c.result;
    if (c.result)
      std::printf("demo: %-6s predicted %.4f s/step, bubble %.1f%%: %s\n",
                  std::string(to_string(c.schedule)).c_str(),
                  c.result->report.step_seconds,
                  100 * c.result->report.bubble_fraction,
                  c.result->report.shape.c_str());
  }
  const auto& best = *choices.front().result;
  const int steps = 12, skip = 2;
  auto b = run(job, best.value, steps, skip);
  auto o = run(job, one_f_one_b->value, steps, skip);
  const double tokens = static_cast<double>(job->tokens_per_step());
  std::printf("demo: best (%s) %.4f s/step, bubble %.1f%% per chip: %s; "
              "overruns per step %.1f (%.4f s)\n",
              std::string(to_string(best.value.schedule)).c_str(),
              b.step_seconds, 100 * b.bubble, b.chips.c_str(), b.overruns,
              b.overrun_seconds);
  std::printf("demo: 1f1b %.4f s/step, bubble %.1f%% per chip: %s; overruns "
              "per step %.1f (%.4f s)\n",
              o.step_seconds, 100 * o.bubble, o.chips.c_str(), o.overruns,
              o.overrun_seconds);
  records.push_back({"schedules.demo_tokens_per_second_best_vs_1f1b_wall",
                     tokens / b.step_seconds, "tok/s", tokens / o.step_seconds,
                     o.step_seconds / b.step_seconds,
                     "best: " + std::string(to_string(best.value.schedule)) +
                       " " + best.report.shape + "; predicted ratio " +
                       std::to_string(one_f_one_b->report.step_seconds /
                                      best.report.step_seconds)});
}

/// `text` with `from` replaced by `to` (the demo job changed if absent).
std::string replaced(std::string text, const std::string& from,
                     const std::string& to) {
  const auto at = text.find(from);
  H2_ENFORCE(at != std::string::npos, "the demo job lacks '", from, "'");
  return text.replace(at, from.size(), to);
}

/// Four H100s, the demo model with 16 layers (4 per chip), even stages.
std::shared_ptr<job_config> identical_job(schedule_kind kind,
                                          int chunks_per_chip) {
  std::string toml(demo_job_toml());
  toml = replaced(toml, "n_layer = 12", "n_layer = 14");
  toml = replaced(toml, "\"emulated:mi250x\"", "\"emulated:h100-sxm\"");
  toml =
    replaced(toml, "\"emulated:a100-sxm-40gb\", \"emulated:a100-sxm-40gb\"",
             "\"emulated:h100-sxm\", \"emulated:h100-sxm\"");
  auto job = parse_job(toml, "identical.toml");
  job.plan.mode = plan_mode::even;
  job.plan.schedule = kind;
  job.plan.chunks_per_chip = chunks_per_chip;
  job.plan.recompute.assign(job.plan.stages.size() * job.plan.chunks_per_chip,
                            recompute_policy::none());
  return without_extras(job);
}

/// Part 2: four identical chips.
void identical_chips(std::vector<bench::record>& records) {
  const int p = 4, steps = 8, skip = 2;
  double one_f_one_b_seconds = 0;
  for (auto [kind, v] : {std::pair{schedule_kind::one_f_one_b, 1},
                         std::pair{schedule_kind::interleaved_1f1b, 2},
                         std::pair{schedule_kind::zb_h1, 1},
                         std::pair{schedule_kind::zb_hetero, 2}}) {
    auto job = identical_job(kind, v);
    const plan even = scheduler::make_plan(*job);
    const int m = even.replicas[0].micro_batches;
    runtime::profiled_measurements meas(*job);
    auto predicted = scheduler::evaluate_plan(*job, even, meas);
    auto r = run(job, even, steps, skip);
    if (kind == schedule_kind::one_f_one_b)
      one_f_one_b_seconds = r.step_seconds;
    // zb-hetero's greedy lists have no textbook value: ZB-H1's stands in.
    const bool greedy = kind == schedule_kind::zb_hetero;
    const double theory = scheduler::theoretical_bubble(
      greedy ? schedule_kind::zb_h1 : kind, p, m, greedy ? 1 : v);
    std::string name(to_string(kind));
    std::replace(name.begin(), name.end(), '-', '_');
    if (v > 1)
      name += "_v" + std::to_string(v);
    std::printf("4 x h100, %s (%d chunk%s per chip), %d micro-batches: step "
                "%.4f s (simulated %.4f s), bubble measured %.2f%%, "
                "simulated %.2f%%, textbook (F = B = W) %.2f%%; per chip %s; "
                "overruns per step %.1f (%.4f s)\n",
                std::string(to_string(kind)).c_str(), v, v > 1 ? "s" : "", m,
                r.step_seconds, predicted.step_seconds, 100 * r.bubble,
                100 * predicted.bubble_fraction, 100 * theory, r.chips.c_str(),
                r.overruns, r.overrun_seconds);
    records.push_back(
      {"schedules.identical_bubble_measured_vs_textbook_" + name, r.bubble,
       "share", theory, r.bubble / theory,
       "simulated " + std::to_string(predicted.bubble_fraction)});
    if (kind != schedule_kind::one_f_one_b)
      records.push_back(
        {"schedules.identical_step_seconds_" + name + "_vs_1f1b_wall",
         r.step_seconds, "s", one_f_one_b_seconds,
         one_f_one_b_seconds / r.step_seconds, "4 x h100, even stages"});
  }
}

/// Part 3: cluster-1024.
void cluster_1024(std::vector<bench::record>& records) {
  auto job =
    load_job_file(std::string(H2_SOURCE_DIR) + "/examples/cluster-1024.toml");
  double one_f_one_b = 0;
  for (auto kind : {schedule_kind::one_f_one_b, schedule_kind::gpipe,
                    schedule_kind::interleaved_1f1b, schedule_kind::zb_h1}) {
    runtime::profiled_measurements m(job);
    scheduler::planner_options o;
    o.schedule = kind;
    auto t0 = std::chrono::steady_clock::now();
    std::optional<scheduler::planned> found;
    try {
      found = scheduler::plan_auto(job, m, o);
    } catch (const scheduler::infeasible_error& e) {
      std::printf("cluster-1024: %-16s no plan: %s\n",
                  std::string(to_string(kind)).c_str(), e.problem().c_str());
      continue;
    }
    const auto& r = *found;
    const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
        .count();
    if (kind == schedule_kind::one_f_one_b)
      one_f_one_b = r.report.step_seconds;
    std::printf("cluster-1024: %-16s predicted step %.3f s, bubble %.1f%%, "
                "planned in %.2f s\n",
                std::string(to_string(kind)).c_str(), r.report.step_seconds,
                100 * r.report.bubble_fraction, seconds);
    if (kind != schedule_kind::one_f_one_b)
      records.push_back({"schedules.cluster1024_step_" +
                           std::string(to_string(kind)) + "_vs_1f1b_predicted",
                         r.report.step_seconds, "s", one_f_one_b,
                         r.report.step_seconds / one_f_one_b,
                         "planned in " + std::to_string(seconds) + " s"});
  }
}

/// The textbook timelines, one SVG per schedule, into `dir`.
void draw_timelines(const std::string& dir) {
  const int p = 4, m = 8;
  for (auto kind : all_schedule_kinds) {
    // zb-hetero is zb-h1 on one chunk of identical chips: drawn on two.
    const int v = kind == schedule_kind::interleaved_1f1b ||
                      kind == schedule_kind::zb_hetero
                    ? 2
                    : 1;
    scheduler::simulated_pipeline pipe;
    pipe.kind = kind;
    pipe.micro_batches = m;
    pipe.layout = scheduler::pipeline_layout::dealt(std::vector<int>(p, v));
    for (int c = 0; c < p * v; ++c) {
      scheduler::simulated_stage s;
      s.forward_seconds = 1.0 / v;
      s.backward_seconds = 2.0 / v;
      s.input_seconds = s.weight_seconds = 1.0 / v;
      pipe.stages.push_back(s);
    }
    auto sim = scheduler::simulate({pipe}, {}, true);
    std::vector<std::vector<std::string>> labels(1);
    for (int k = 0; k < p; ++k)
      labels[0].push_back("chip " + std::to_string(k));
    char title[160];
    std::snprintf(
      title, sizeof title, "%s: 4 chips, 8 micro-batches%s, bubble %.1f%%",
      std::string(to_string(kind)).c_str(), v > 1 ? ", 2 chunks per chip" : "",
      100 * sim.bubble_fraction);
    std::ofstream(dir + "/schedule-" + std::string(to_string(kind)) + ".svg")
      << scheduler::render_svg(sim, labels, title);
  }
}

} // namespace

int main(int argc, char** argv) {
  if (auto dir = bench::flag_value(argc, argv, "--svg"); !dir.empty()) {
    draw_timelines(dir);
    return 0;
  }
  std::vector<bench::record> records;
  cluster_1024(records);
  identical_chips(records);
  demo_cluster(records);
  for (const auto& r : records)
    bench::print(r);
  if (auto out = bench::out_path(argc, argv); !out.empty())
    bench::append_results(out, records);
  return 0;
}
