// Runtime overhead and emulation fidelity under the wall clock.
//
// The demo's four emulated chips run a tiny GPT whose real CPU math is a
// small fraction of the emulated time, so whatever the wall clock adds over
// the virtual clock is the runtime's own cost: actor messages, channel
// hand-offs, the scheduler's phases, thread wake-ups.
// - runtime overhead: measured (wall) step time / the virtual clock's step
//   time of the same run; target <= 1.05.
// - emulation fidelity: each compute op's wall duration / its emulated
//   duration: median and spread.
#include "bench_common.hpp"
#include "test_jobs.hpp" // the unit tests' small model

#include "h2/actors/local_job.hpp"
#include "h2/runtime/reports.hpp"
#include "h2/core/job.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <cstdio>

using namespace h2;

namespace {

const std::string job_toml = "[job]\nname = \"overhead\"\n" +
                             h2::test::model_toml(17, 16, 32, 2, 2) + R"(
[train]
steps = 30
global_batch = 16
micro_batch = 2
[emulation]
clock = "wall"
time_scale = 1000
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x",
         "emulated:a100-sxm-40gb", "emulated:a100-sxm-40gb"]
)";

} // namespace

int main(int argc, char** argv) {
  auto job = std::make_shared<job_config>(parse_job(job_toml, "overhead"));
  actors::local_job local(job, scheduler::make_plan(*job));
  runtime::step_recorder c;
  local.run({job->train.steps, false}, c);

  double wall = 0, virt = 0;
  std::vector<double> ratios;
  std::uint64_t overruns = 0;
  for (std::size_t i = 2; i < c.steps.size(); ++i) { // skip warm-up steps
    const auto& s = c.steps[i];
    wall += s.wall_step_seconds;
    virt += s.virtual_step_seconds;
    for (const auto& t : s.ops) {
      using runtime::recorded_op;
      const auto kind = t.op.kind;
      const bool compute = kind == recorded_op::forward ||
                           kind == recorded_op::backward ||
                           kind == recorded_op::optimizer;
      if (compute && t.op.virtual_seconds > 0)
        ratios.push_back((t.op.end - t.op.start) / t.op.virtual_seconds);
    }
  }
  for (const auto& chip : c.steps.back().chips)
    overruns += chip.overruns;
  const auto steps = static_cast<double>(c.steps.size() - 2);
  std::vector<bench::record> rs;
  rs.push_back({"runtime_overhead.step_seconds_wall_vs_virtual", wall / steps,
                "s", virt / steps, wall / virt,
                "4 emulated chips, tiny GPT, 1F1B, 8 micro-batches; target "
                "<= 1.05"});
  rs.push_back({"emulation_fidelity.op_wall_over_emulated_median",
                bench::quantile(ratios, 0.5), "ratio", 1.0,
                bench::quantile(ratios, 0.5),
                std::to_string(ratios.size()) + " compute ops"});
  rs.push_back({"emulation_fidelity.op_wall_over_emulated_p10",
                bench::quantile(ratios, 0.1), "ratio", 1.0,
                bench::quantile(ratios, 0.1), ""});
  rs.push_back({"emulation_fidelity.op_wall_over_emulated_p90",
                bench::quantile(ratios, 0.9), "ratio", 1.0,
                bench::quantile(ratios, 0.9), ""});
  rs.push_back({"emulation_fidelity.op_wall_over_emulated_max",
                bench::quantile(ratios, 1.0), "ratio", 1.0,
                bench::quantile(ratios, 1.0),
                std::to_string(overruns) + " overruns in the run"});
  for (const auto& r : rs)
    bench::print(r);
  if (auto out = bench::out_path(argc, argv); !out.empty())
    bench::append_results(out, rs);
  return 0;
}
