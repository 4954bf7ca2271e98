// HeteroAuto's planning time at scale, 64 to 10,240 chips: the 1,024-chip /
// 99B-parameter example (examples/cluster-1024.toml) cut to 64 and 256
// chips (every sixteenth / fourth node, the batch in proportion) and whole,
// and the 10,240-chip example of eight kinds (examples/cluster-10k.toml)
// cut to 2,048 and 5,120 chips and whole. The chips are profiled as h2-plan
// profiles them (emulated: their own charged times). Baseline: the 5 s
// target (ratio < 1 meets it); the predicted step time and throughput are
// recorded beside it.
#include "bench_common.hpp"

#include "h2/runtime/auto_plan.hpp"
#include "h2/core/job.hpp"
#include "h2/scheduler/compare.hpp"
#include "h2/scheduler/planner.hpp"

#include <chrono>
#include <cstdio>
#include <utility>

using namespace h2;

int main(int argc, char** argv) {
  const std::string out = bench::out_path(argc, argv);
  const auto c1024 =
    load_job_file(std::string(H2_SOURCE_DIR) + "/examples/cluster-1024.toml");
  const auto c10k =
    load_job_file(std::string(H2_SOURCE_DIR) + "/examples/cluster-10k.toml");
  const double target = 5.0;
  std::vector<bench::record> records;
  const std::pair<const job_config*, int> cuts[] = {
    {&c1024, 16}, {&c1024, 4}, {&c1024, 1}, {&c10k, 5}, {&c10k, 2}, {&c10k, 1}};
  for (const auto& [full, stride] : cuts) {
    job_config job =
      stride == 1 ? *full : scheduler::sub_cluster(*full, stride);
    const int chips = static_cast<int>(job.chips().size());
    // Best of three runs: planning is deterministic, the machine is not.
    double best = 1e300;
    scheduler::planned result;
    for (int run = 0; run < 3; ++run) {
      runtime::profiled_measurements m(job);
      auto t0 = std::chrono::steady_clock::now();
      result = scheduler::plan_auto(job, m);
      best = std::min(best, std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - t0)
                              .count());
    }
    const auto& r = result.report;
    char note[256];
    std::snprintf(note, sizeof note,
                  "%zu replicas x %zu stages, %zu layouts, %zu simulations; "
                  "predicted %.3f s/step, %.0f tokens/s, bubble %.1f%%",
                  result.value.replicas.size(),
                  result.value.replicas.front().stages.size(), r.candidates,
                  r.simulations, r.step_seconds, r.tokens_per_second,
                  100 * r.bubble_fraction);
    records.push_back(
      {"plan_scale.planning_seconds_" + std::to_string(chips) + "_chips", best,
       "s", target, best / target, note});
    bench::print(records.back());
  }
  if (!out.empty())
    bench::append_results(out, records);
  return 0;
}
