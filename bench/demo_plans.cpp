// The demo cluster: tokens/s of the even plan vs the best manual plan this
// search can find. Candidates (every stage order of the four chips and every
// split of the demo's 8 layers into 4 non-empty stages) are ranked by one
// step on the virtual clock (deterministic, cheap); the best and the even
// plan are then both trained under the wall clock and compared.
#include "bench_common.hpp"

#include "h2/actors/local_job.hpp"
#include "h2/core/job.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <algorithm>
#include <set>

using namespace h2;

namespace {

/// Mean step seconds of steps [skip, steps) of `p`.
double step_seconds(std::shared_ptr<job_config> job, const plan& p, int steps,
                    int skip) {
  actors::local_job local(job, p);
  actors::step_recorder c;
  local.run({steps, false}, c);
  double total = 0;
  for (int i = skip; i < steps; ++i)
    total += c.steps[static_cast<std::size_t>(i)].step_seconds;
  return total / (steps - skip);
}

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
  auto virtual_job = std::make_shared<job_config>(*wall_job);
  virtual_job->emulation.clock = clock_mode::virtual_clock;

  const plan even = scheduler::make_plan(*wall_job);
  std::vector<chip_id> chips = wall_job->plan.stages;
  std::sort(chips.begin(), chips.end());
  std::vector<std::vector<int>> splits;
  std::vector<int> cur;
  const int stages = static_cast<int>(chips.size());
  compositions(wall_job->model.num_layers(), stages, cur, splits);

  plan best = even;
  double best_seconds = step_seconds(virtual_job, even, 1, 0);
  const double even_virtual = best_seconds;
  std::set<std::vector<std::string>> seen_orders;
  int candidates = 0;
  do {
    // Chips of one kind are interchangeable: try each order of kinds once.
    std::vector<std::string> kinds;
    for (auto& c : chips)
      kinds.push_back(wall_job->find_chip(c)->profile.name);
    if (!seen_orders.insert(kinds).second)
      continue;
    for (const auto& split : splits) {
      plan p = even;
      int next = 0;
      for (int s = 0; s < stages; ++s) {
        auto& st = p.replicas[0].stages[static_cast<std::size_t>(s)];
        st.chip = chips[static_cast<std::size_t>(s)];
        st.first_layer = next;
        st.end_layer = next += split[static_cast<std::size_t>(s)];
      }
      ++candidates;
      double seconds;
      try {
        seconds = step_seconds(virtual_job, p, 1, 0);
      } catch (const std::exception&) {
        continue; // does not fit in some chip's memory
      }
      if (seconds < best_seconds) {
        best_seconds = seconds;
        best = p;
      }
    }
  } while (std::next_permutation(chips.begin(), chips.end()));
  std::printf("searched %d plans on the virtual clock: even %.4f s/step, "
              "best %.4f s/step (%s)\n",
              candidates, even_virtual, best_seconds,
              describe(*wall_job, best).c_str());

  const int steps = 20, skip = 2;
  double even_wall = step_seconds(wall_job, even, steps, skip);
  double best_wall = step_seconds(wall_job, best, steps, skip);
  double tokens = static_cast<double>(wall_job->tokens_per_step());
  std::vector<bench::record> rs;
  rs.push_back({"demo.tokens_per_second_best_manual_vs_even_wall",
                tokens / best_wall, "tok/s", tokens / even_wall,
                even_wall / best_wall,
                "best: " + describe(*wall_job, best) +
                  "; even: " + describe(*wall_job, even)});
  rs.push_back({"demo.step_seconds_best_manual_vs_even_virtual", best_seconds,
                "s", even_virtual, best_seconds / even_virtual,
                std::to_string(candidates) + " plans searched"});
  for (const auto& r : rs)
    bench::print(r);
  if (auto out = bench::out_path(argc, argv); !out.empty())
    bench::append_results(out, rs);
  return 0;
}
