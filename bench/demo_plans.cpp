// The demo cluster: tokens/s of the even plan vs the best manual plan this
// search can find. Every stage order of the four chips and every split of
// the demo's layers into 4 non-empty stages is estimated from the emulated
// chips' own per-layer times (a 1F1B bottleneck estimate); the 20 best
// estimates are run for one step on the virtual clock, and the fastest of
// those and the even plan are then both trained under the wall clock.
#include "bench_common.hpp"
#include "run_plan.hpp"

#include "h2/core/job.hpp"
#include "h2/devices/emulated/cost_function.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <algorithm>
#include <map>
#include <set>

using namespace h2;

namespace {

/// Every composition of `layers` into `parts` positive counts.
void compositions(int layers, int parts, std::vector<int>& cur,
                  std::vector<std::vector<int>>& out) {
  if (parts == 1) {
    cur.push_back(layers);
    out.push_back(cur);
    cur.pop_back();
    return;
  }
  for (int k = 1; k <= layers - parts + 1; ++k) {
    cur.push_back(k);
    compositions(layers - k, parts - 1, cur, out);
    cur.pop_back();
  }
}

std::string describe(const job_config& job, const plan& p) {
  std::string s;
  for (const auto& st : p.replicas[0].stages)
    s += (s.empty() ? "" : " | ") + job.find_chip(st.chip)->profile.name +
         " x" + std::to_string(st.num_layers());
  return s;
}

} // namespace

int main(int argc, char** argv) {
  auto wall_job =
    std::make_shared<job_config>(parse_job(demo_job_toml(), "demo.toml"));
  wall_job->metrics.port = 0;
  wall_job->rebalance = rebalance_config{}; // each plan as it is
  wall_job->drills.clear();
  auto virtual_job = std::make_shared<job_config>(*wall_job);
  virtual_job->emulation.clock = clock_mode::virtual_clock;

  const plan even = scheduler::make_plan(*wall_job);
  std::vector<chip_id> chips = wall_job->plan.stages;
  std::sort(chips.begin(), chips.end());
  std::vector<std::vector<int>> splits;
  std::vector<int> cur;
  const int stages = static_cast<int>(chips.size());
  compositions(wall_job->model.num_layers(), stages, cur, splits);

  // Per-layer forward + backward seconds of one micro-batch on each chip.
  const auto& job = *wall_job;
  const int m = job.train.global_batch / job.train.micro_batch;
  std::map<chip_id, std::vector<double>> layer_seconds;
  for (const auto& c : chips) {
    const chip_spec& spec = *job.find_chip(c);
    devices::emulated_cost_function cost(spec.profile, spec.compute_dtype,
                                         job.emulation.time_scale,
                                         job.emulation.overhead_scale);
    for (int l = 0; l < job.model.num_layers(); ++l) {
      auto w = compute_layer_work(job.model, l, job.train.micro_batch,
                                  spec.compute_dtype);
      layer_seconds[c].push_back(
        cost.layer_seconds(w, devices::pass::forward) +
        cost.layer_seconds(w, devices::pass::backward));
    }
  }
  std::vector<std::pair<double, plan>> estimates;
  std::set<std::vector<std::string>> seen_orders;
  do {
    // Chips of one kind are interchangeable: try each order of kinds once.
    std::vector<std::string> kinds;
    for (auto& c : chips)
      kinds.push_back(job.find_chip(c)->profile.name);
    if (!seen_orders.insert(kinds).second)
      continue;
    for (const auto& split : splits) {
      plan p = even;
      int next = 0;
      double slowest = 0, total = 0;
      for (int s = 0; s < stages; ++s) {
        auto& st = p.replicas[0].stages[static_cast<std::size_t>(s)];
        st.chip = chips[static_cast<std::size_t>(s)];
        st.first_layer = next;
        st.end_layer = next += split[static_cast<std::size_t>(s)];
        double stage = 0;
        for (int l = st.first_layer; l < st.end_layer; ++l)
          stage += layer_seconds[st.chip][static_cast<std::size_t>(l)];
        slowest = std::max(slowest, stage);
        total += stage;
      }
      // 1F1B: every stage's work once, then the slowest for the rest.
      estimates.emplace_back(total + (m - 1) * slowest, p);
    }
  } while (std::next_permutation(chips.begin(), chips.end()));
  const int candidates = static_cast<int>(estimates.size());
  std::sort(estimates.begin(), estimates.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });

  plan best = even;
  double best_seconds = bench::mean_step_seconds(virtual_job, even, 1, 0);
  const double even_virtual = best_seconds;
  const std::size_t measured = std::min<std::size_t>(20, estimates.size());
  for (std::size_t i = 0; i < measured; ++i) {
    double seconds;
    try {
      seconds =
        bench::mean_step_seconds(virtual_job, estimates[i].second, 1, 0);
    } catch (const std::exception&) {
      continue; // does not fit in some chip's memory
    }
    if (seconds < best_seconds) {
      best_seconds = seconds;
      best = estimates[i].second;
    }
  }
  std::printf("estimated %d plans, ran the best %zu on the virtual clock: "
              "even %.4f s/step, best %.4f s/step (%s)\n",
              candidates, measured, even_virtual, best_seconds,
              describe(*wall_job, best).c_str());

  const int steps = 20, skip = 2;
  double even_wall = bench::mean_step_seconds(wall_job, even, steps, skip);
  double best_wall = bench::mean_step_seconds(wall_job, best, steps, skip);
  double tokens = static_cast<double>(wall_job->tokens_per_step());
  std::vector<bench::record> rs;
  rs.push_back({"demo.tokens_per_second_best_manual_vs_even_wall",
                tokens / best_wall, "tok/s", tokens / even_wall,
                even_wall / best_wall,
                "best: " + describe(*wall_job, best) +
                  "; even: " + describe(*wall_job, even)});
  rs.push_back({"demo.step_seconds_best_manual_vs_even_virtual", best_seconds,
                "s", even_virtual, best_seconds / even_virtual,
                std::to_string(candidates) + " plans estimated, " +
                  std::to_string(measured) + " run"});
  for (const auto& r : rs)
    bench::print(r);
  if (auto out = bench::out_path(argc, argv); !out.empty())
    bench::append_results(out, rs);
  return 0;
}
