// Single-chip speed: tokens/s of H2 training the demo's GPT on one `cpu`
// chip vs a bare libtorch loop training the same model (same layers, data
// and AdamW) in the same process, one intra-op thread each. Target >= 0.95.
#include "bench_common.hpp"

#include "h2/actors/local_job.hpp"
#include "h2/core/job.hpp"
#include "h2/model/trainer.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <ATen/Parallel.h>

#include <chrono>
#include <string>

using namespace h2;

namespace {

std::string job_toml() {
  std::string demo(demo_job_toml());
  // The demo's model and batch on one host CPU chip, timed by the wall.
  auto cut = demo.find("[emulation]");
  return demo.substr(0, cut) + R"(
[emulation]
clock = "wall"
[[nodes]]
chips = ["cpu"]
)";
}

/// Tokens/s of the bare loop over `steps` steps (after one warm-up step).
double bare_loop(const job_config& job, int steps) {
  at::set_num_threads(job.train.threads_per_chip);
  model::single_chip_trainer trainer(job);
  trainer.train_step(0);
  auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= steps; ++step)
    trainer.train_step(step);
  double seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
  return steps * static_cast<double>(job.tokens_per_step()) / seconds;
}

double h2_run(std::shared_ptr<job_config> job, int steps) {
  actors::local_job local(job, scheduler::make_plan(*job));
  actors::step_recorder c;
  local.run({steps + 1, false}, c);
  double seconds = 0;
  for (std::size_t i = 1; i < c.steps.size(); ++i)
    seconds += c.steps[i].wall_step_seconds;
  return steps * static_cast<double>(job->tokens_per_step()) / seconds;
}

} // namespace

int main(int argc, char** argv) {
  auto job = std::make_shared<job_config>(parse_job(job_toml(), "single"));
  const int steps = 15;
  // Alternate to spread the machine's noise over both.
  std::vector<double> bare, h2;
  for (int round = 0; round < 3; ++round) {
    bare.push_back(bare_loop(*job, steps));
    h2.push_back(h2_run(job, steps));
  }
  double b = bench::quantile(bare, 0.5), h = bench::quantile(h2, 0.5);
  bench::record r{"single_chip.tokens_per_second_h2_vs_bare_libtorch",
                  h,
                  "tok/s",
                  b,
                  h / b,
                  "demo GPT (" + std::to_string(model_parameters(job->model)) +
                    " params) on one cpu chip, median of 3; target >= 0.95"};
  bench::print(r);
  if (auto out = bench::out_path(argc, argv); !out.empty())
    bench::append_results(out, {r});
  return 0;
}
