// Single-chip speed: tokens/s of H2 training the demo's GPT on one `cpu`
// chip (or the chip --chip names, e.g. cuda:0, in fp32) vs a bare libtorch
// loop training the same model (same layers, data and AdamW) on the same
// device in the same process, one intra-op thread each. Target >= 0.95.
// On the host CPU also H2 in bf16 against H2 in fp32, on the path the host
// chooses and on each path it can run (docs/emulation.md, "bf16 on the host
// CPU"). Target >= 0.7.
#include "bench_common.hpp"

#include "h2/actors/local_job.hpp"
#include "h2/core/job.hpp"
#include "h2/devices/cpu_bf16.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/devices/memory.hpp"
#include "h2/model/trainer.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <ATen/Parallel.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>

using namespace h2;

namespace {

double bare_loop_on_this_thread(const job_config& job, c10::Device device,
                                int steps, bool accounted) {
  at::set_num_threads(job.train.threads_per_chip);
  std::optional<devices::memory_binding> binding;
  if (accounted)
    binding.emplace(std::make_shared<devices::memory_account>(
      "bench", std::uint64_t{1} << 40));
  model::single_chip_trainer trainer(job, device);
  trainer.train_step(0);
  auto start = std::chrono::steady_clock::now();
  for (int step = 1; step <= steps; ++step)
    trainer.train_step(step);
  double seconds = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();
  return steps * static_cast<double>(job.tokens_per_step()) / seconds;
}

std::string job_toml(const std::string& chip, const std::string& dtype = "fp32",
                     const std::string& cpu_bf16 = "auto") {
  std::string demo(demo_job_toml());
  // The demo's model and batch on one chip, timed by the wall.
  auto cut = demo.find("[emulation]");
  return demo.substr(0, cut) + R"(
[emulation]
clock = "wall"
[ditorch]
cpu_bf16 = ")" + cpu_bf16 +
         R"("
[[nodes]]
chips = [{device = ")" +
         chip + R"(", dtype = ")" + dtype + R"("}]
)";
}

/// Tokens/s of the bare loop over `steps` steps (after one warm-up step).
/// It runs on a thread of its own, as a chip does.
double bare_loop(const job_config& job, c10::Device device, int steps,
                 bool accounted) {
  double result = 0;
  std::thread([&] {
    result = bare_loop_on_this_thread(job, device, steps, accounted);
  }).join();
  return result;
}

double h2_run(std::shared_ptr<job_config> job, int steps) {
  actors::local_job local(job, scheduler::make_plan(*job));
  runtime::step_recorder c;
  local.run({steps + 1, false}, c);
  // From the start of the second step to the end of the last, gaps between
  // steps included, as the bare loop's clock sees them.
  double seconds = c.steps.back().wall_end - c.steps[1].wall_start;
  return steps * static_cast<double>(job->tokens_per_step()) / seconds;
}

/// H2 in bf16 on the host CPU against H2 in fp32, median of 3 alternating
/// rounds: on the path this host chooses, and on each path it can run.
std::vector<bench::record> bf16_records(int steps) {
  auto make = [](const std::string& dtype, const std::string& path) {
    return std::make_shared<job_config>(
      parse_job(job_toml("cpu", dtype, path), "single-" + dtype));
  };
  const auto host = devices::host_cpu_bf16(cpu_bf16::automatic);
  std::vector<std::string> paths{"auto", "fp32-accumulate"};
  if (host.path == cpu_bf16::native)
    paths.push_back("native");
  std::vector<double> fp32;
  std::map<std::string, std::vector<double>> bf16;
  for (int round = 0; round < 3; ++round) {
    fp32.push_back(h2_run(make("fp32", "auto"), steps));
    for (const auto& p : paths)
      bf16[p].push_back(h2_run(make("bf16", p), steps));
  }
  const double f = bench::quantile(fp32, 0.5);
  std::vector<bench::record> out;
  for (const auto& p : paths) {
    const double b = bench::quantile(bf16[p], 0.5);
    const std::string name =
      p == "auto" ? "single_chip.bf16_vs_fp32_tokens_per_second"
                  : "single_chip.bf16_" + std::string(p == "native"
                                                        ? "native"
                                                        : "fp32_accumulate") +
                      "_vs_fp32_tokens_per_second";
    out.push_back(
      {name, b, "tok/s", f, b / f,
       (p == "auto" ? devices::describe(host) + "; target >= 0.7"
                    : "bf16 path " + p) +
         "; H2 on one cpu chip, 1 thread, median of 3"});
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  std::string chip = bench::flag_value(argc, argv, "--chip");
  if (chip.empty())
    chip = "cpu";
  auto job = std::make_shared<job_config>(parse_job(job_toml(chip), "single"));
  const c10::Device device = devices::torch_device_of(*job->chips().front());
  const int steps = 15;
  // Alternate to spread the machine's noise over all three.
  std::vector<double> bare, accounted, h2;
  for (int round = 0; round < 3; ++round) {
    bare.push_back(bare_loop(*job, device, steps, false));
    accounted.push_back(bare_loop(*job, device, steps, true));
    h2.push_back(h2_run(job, steps));
  }
  double b = bench::quantile(bare, 0.5), a = bench::quantile(accounted, 0.5),
         h = bench::quantile(h2, 0.5);
  std::string model =
    "demo GPT (" + std::to_string(model_parameters(job->model)) +
    " params) on one " + chip + " chip in fp32, 1 thread, median of 3";
  // Names of the cpu figures as before; other chips get their own.
  const std::string prefix =
    chip == "cpu" ? "single_chip." : "single_chip." + chip + ".";
  std::vector<bench::record> rs{
    {prefix + "tokens_per_second_h2_vs_bare_libtorch", h, "tok/s", b, h / b,
     model + "; target >= 0.95"},
    {prefix + "tokens_per_second_memory_accounting_vs_bare", a, "tok/s", b,
     a / b, "the bare loop with every host allocation charged to a chip"}};
  if (chip == "cpu")
    for (auto& r : bf16_records(steps))
      rs.push_back(std::move(r));
  for (const auto& r : rs)
    bench::print(r);
  if (auto out = bench::out_path(argc, argv); !out.empty())
    bench::append_results(out, rs);
  return 0;
}
