#include "h2/scheduler/plan_builder.hpp"

#include "h2/core/error.hpp"

#include <algorithm>

namespace h2::scheduler {

std::vector<int> even_split(int layers, int stages) {
  H2_ENFORCE(stages >= 1 && layers >= stages, "layers=", layers,
             " stages=", stages);
  std::vector<int> out(static_cast<std::size_t>(stages), layers / stages);
  for (int i = 0; i < layers % stages; ++i)
    ++out[static_cast<std::size_t>(i)];
  return out;
}

plan make_plan(const job_config& job) {
  const auto& pc = job.plan;
  if (pc.mode == plan_mode::automatic)
    throw config_error("plan.mode",
                       "\"auto\" plans are made by HeteroAuto "
                       "(scheduler::plan_auto, apps::plan_job), not by "
                       "make_plan; or run h2-plan JOB --json > plan.json "
                       "and h2-launch JOB --plan plan.json");
  const auto chips = pc.stages.size();
  const int stages = static_cast<int>(chips) * pc.chunks_per_chip;
  std::vector<int> counts = pc.mode == plan_mode::manual
                              ? pc.layers
                              : even_split(job.model.num_layers(), stages);
  plan p;
  p.schedule = pc.schedule;
  replica_plan r;
  r.micro_batch_size = job.train.micro_batch;
  r.micro_batches = job.train.global_batch / job.train.micro_batch;
  int next = 0;
  for (int s = 0; s < stages; ++s) {
    stage_plan sp;
    sp.chip = pc.stages[static_cast<std::size_t>(s) % chips]; // dealt
    sp.first_layer = next;
    sp.end_layer = next += counts[static_cast<std::size_t>(s)];
    sp.recompute = pc.recompute.empty()
                     ? recompute_policy::none()
                     : pc.recompute[static_cast<std::size_t>(s)];
    r.stages.push_back(sp);
  }
  p.replicas.push_back(std::move(r));
  check_plan(p, job, "plan");
  return p;
}

std::optional<plan> deal_chunks(const plan& p, int v) {
  H2_ENFORCE(v >= 1, "v=", v);
  plan out = p;
  for (auto& r : out.replicas) {
    H2_ENFORCE(replica_chips(r).size() == r.stages.size(),
               "deal_chunks needs one stage per chip");
    const int chips = static_cast<int>(r.stages.size());
    if (chips < 2 || r.stages.back().end_layer < chips * v)
      return std::nullopt; // one chip, or fewer layers than chunks
    // Only each chip's count of layers matters once they are dealt: lift
    // chips below v with layers of the chip holding the most.
    std::vector<int> counts;
    for (const auto& st : r.stages)
      counts.push_back(st.num_layers());
    for (auto& n : counts)
      while (n < v) {
        ++n;
        --*std::max_element(counts.begin(), counts.end());
      }
    std::vector<std::vector<int>> split;
    for (int n : counts)
      split.push_back(even_split(n, v));
    std::vector<stage_plan> dealt;
    int next = 0;
    for (int round = 0; round < v; ++round)
      for (std::size_t k = 0; k < r.stages.size(); ++k) {
        stage_plan sp = r.stages[k];
        sp.first_layer = next;
        sp.end_layer = next += split[k][static_cast<std::size_t>(round)];
        dealt.push_back(sp);
      }
    r.stages = std::move(dealt);
  }
  return out;
}

int chunks_per_chip(const plan& p) {
  H2_ENFORCE(!p.replicas.empty(), "a plan without replicas");
  const auto& r = p.replicas.front();
  return static_cast<int>(r.stages.size() / replica_chips(r).size());
}

pipeline_layout layout_of(const replica_plan& r) {
  pipeline_layout out;
  out.chips = static_cast<int>(replica_chips(r).size());
  out.chunk_chip = stage_positions(r);
  return out;
}

void check_plan(const plan& p, const job_config& job,
                const std::string& origin) {
  validate_plan(p, job, origin);
  for (std::size_t ri = 0; ri < p.replicas.size(); ++ri) {
    const auto& r = p.replicas[ri];
    const auto why = layout_problem(p.schedule, layout_of(r), r.micro_batches);
    if (!why.empty())
      throw config_error(
        origin + ".replicas[" + std::to_string(ri) + "].stages", why);
  }
}

plan even_plan(const job_config& job, const std::vector<chip_id>& chips) {
  if (chips.empty())
    throw config_error("plan.stages", "no chips for an even plan");
  if (static_cast<int>(chips.size()) * job.plan.chunks_per_chip >
      job.model.num_layers())
    throw config_error("plan.stages",
                       std::to_string(chips.size()) + " chips x " +
                         std::to_string(job.plan.chunks_per_chip) +
                         " chunks for an even plan but the model has only " +
                         std::to_string(job.model.num_layers()) + " layers");
  job_config even = job;
  even.plan.mode = plan_mode::even;
  even.plan.stages = chips;
  even.plan.layers.clear();
  even.plan.recompute.assign(chips.size() * even.plan.chunks_per_chip,
                             recompute_policy::none());
  return make_plan(even);
}

} // namespace h2::scheduler
