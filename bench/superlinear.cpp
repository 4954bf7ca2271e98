// The super-linear ratio (H2 paper: up to 1.1637) on
// examples/superlinear.toml (4 H100 + 4 MI250X: compute differs 2.6x,
// memory 1.6x, memory binding): HeteroAuto's plan of all eight chips
// against the sum of the homogeneous sub-clusters, each planned by
// HeteroAuto alone with its share of the batch. Predicted (the simulator)
// and measured (the runtime on the virtual clock, 3 steps, the first left
// out). Then HeteroAuto against the even plan on the demo cluster:
// predicted, measured on the virtual clock, and on the wall clock (12 steps
// each, the first 2 left out). The chips are profiled as h2-plan profiles
// them (emulated: their own charged times).
#include "bench_common.hpp"
#include "run_plan.hpp"

#include "h2/runtime/auto_plan.hpp"
#include "h2/core/job.hpp"
#include "h2/scheduler/compare.hpp"
#include "h2/scheduler/planner.hpp"

#include <cstdio>
#include <memory>

using namespace h2;

namespace {

/// `job` on the virtual clock, without a metrics endpoint.
std::shared_ptr<job_config> virtual_copy(const job_config& job) {
  auto out = std::make_shared<job_config>(job);
  out->emulation.clock = clock_mode::virtual_clock;
  out->metrics.port = 0;
  return out;
}

double tokens_per_second(const job_config& job, double step_seconds) {
  return static_cast<double>(job.tokens_per_step()) / step_seconds;
}

/// The predicted ratio of a paper-scale cluster (docs/planner.md, "The
/// super-linear ratio"): each kind's plan and what binds it in the note,
/// and the ratio over the kinds that train alone when some cannot.
void paper_scale(const std::string& name, const job_config& job,
                 std::vector<bench::record>& records) {
  runtime::profiled_measurements m(job);
  auto best = scheduler::plan_auto(job, m);
  auto c = scheduler::compare_with_baselines(job, m, {}, best.report);
  std::string note = "auto " + best.report.shape + "; alone:";
  for (const auto& h : c.homogeneous)
    note += " " + h.name + " " +
            (h.feasible ? h.shape + " binds " + h.binding
                        : "cannot train alone (" + h.lever + ")") +
            ";";
  records.push_back(
    {name + ".super_linear_ratio_predicted", best.report.tokens_per_second,
     "tok/s", c.homogeneous_tokens_per_second, c.super_linear_ratio, note});
  bench::print(records.back());
  if (c.trainable && c.trainable->feasible) {
    records.push_back(
      {name + ".super_linear_ratio_trainable_kinds_predicted",
       c.trainable->tokens_per_second, "tok/s", c.homogeneous_tokens_per_second,
       c.trainable_ratio,
       "the kinds that train alone, mixed: " + c.trainable->shape});
    bench::print(records.back());
  }
}

} // namespace

int main(int argc, char** argv) {
  const std::string out = bench::out_path(argc, argv);
  std::vector<bench::record> records;
  {
    auto job =
      load_job_file(std::string(H2_SOURCE_DIR) + "/examples/superlinear.toml");
    runtime::profiled_measurements m(job);
    auto best = scheduler::plan_auto(job, m);
    auto c = scheduler::compare_with_baselines(job, m, {}, best.report);
    std::string predicted_parts, measured_parts;
    const auto hetero_job = virtual_copy(job);
    const double hetero_measured = tokens_per_second(
      job, bench::mean_step_seconds(hetero_job, best.value, 3, 1));
    double homogeneous_measured = 0;
    for (const auto& h : c.homogeneous) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s%s x%d (batch %d): %.0f tok/s",
                    predicted_parts.empty() ? "" : ", ", h.name.c_str(),
                    h.chips, h.global_batch, h.tokens_per_second);
      predicted_parts += buf;
      if (!h.feasible)
        continue;
      auto part = virtual_copy(job);
      part->train.global_batch = h.global_batch;
      const double tps =
        tokens_per_second(*part, bench::mean_step_seconds(part, h.value, 3, 1));
      homogeneous_measured += tps;
      std::snprintf(buf, sizeof buf, "%s%s: %.0f tok/s",
                    measured_parts.empty() ? "" : ", ", h.name.c_str(), tps);
      measured_parts += buf;
    }
    records.push_back(
      {"superlinear.tokens_per_second_auto_vs_homogeneous_predicted",
       best.report.tokens_per_second, "tok/s", c.homogeneous_tokens_per_second,
       c.super_linear_ratio,
       "auto " + best.report.shape + " vs sum of " + predicted_parts});
    bench::print(records.back());
    records.push_back(
      {"superlinear.tokens_per_second_auto_vs_homogeneous_virtual",
       hetero_measured, "tok/s", homogeneous_measured,
       hetero_measured / homogeneous_measured,
       "runtime, virtual clock: sum of " + measured_parts});
    bench::print(records.back());
  }
  {
    // The paper's scale: cluster-1024 cut to 64 and 256 chips (every
    // sixteenth, fourth node) and whole, and the 1,280-chip mix of five
    // kinds.
    const auto full =
      load_job_file(std::string(H2_SOURCE_DIR) + "/examples/cluster-1024.toml");
    for (int stride : {16, 4, 1})
      paper_scale("cluster_1024_" + std::to_string(1024 / stride) + "_chips",
                  stride == 1 ? full : scheduler::sub_cluster(full, stride),
                  records);
    paper_scale("cluster_mixed_1280",
                load_job_file(std::string(H2_SOURCE_DIR) +
                              "/examples/cluster-mixed-1280.toml"),
                records);
  }
  {
    auto job = parse_job(demo_job_toml(), "demo.toml");
    job.rebalance = rebalance_config{}; // each plan as it is
    job.drills.clear();
    job_config planned = job;
    planned.plan.mode = plan_mode::automatic;
    runtime::profiled_measurements m(planned);
    auto best = scheduler::plan_auto(planned, m);
    auto c = scheduler::compare_with_baselines(planned, m, {}, best.report);
    records.push_back(
      {"demo.tokens_per_second_auto_vs_even_predicted",
       best.report.tokens_per_second, "tok/s", c.even.tokens_per_second,
       best.report.tokens_per_second / c.even.tokens_per_second,
       "auto " + best.report.shape + ", " +
         std::to_string(best.value.replicas[0].micro_batches) + " x " +
         std::to_string(best.value.replicas[0].micro_batch_size) +
         " sequences; " + c.even.name});
    bench::print(records.back());
    const auto virt = virtual_copy(job);
    const double auto_virtual =
      bench::mean_step_seconds(virt, best.value, 3, 1);
    const double even_virtual =
      bench::mean_step_seconds(virt, c.even.value, 3, 1);
    records.push_back({"demo.tokens_per_second_auto_vs_even_virtual",
                       tokens_per_second(job, auto_virtual), "tok/s",
                       tokens_per_second(job, even_virtual),
                       even_virtual / auto_virtual, "runtime, virtual clock"});
    bench::print(records.back());
    auto wall = std::make_shared<job_config>(job);
    wall->metrics.port = 0;
    const double auto_wall = bench::mean_step_seconds(wall, best.value, 12, 2);
    const double even_wall =
      bench::mean_step_seconds(wall, c.even.value, 12, 2);
    char note[96];
    std::snprintf(note, sizeof note, "runtime, wall clock (time_scale %g)",
                  job.emulation.time_scale);
    records.push_back({"demo.tokens_per_second_auto_vs_even_wall",
                       tokens_per_second(job, auto_wall), "tok/s",
                       tokens_per_second(job, even_wall), even_wall / auto_wall,
                       note});
    bench::print(records.back());
  }
  if (!out.empty())
    bench::append_results(out, records);
  return 0;
}
