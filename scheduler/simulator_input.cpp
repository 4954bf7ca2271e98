// What the simulator is given for a plan (docs/planner.md, "Cost model"):
// each stage's costs on its chip, its links, and the reduction groups'
// rings, with ZeRO-1's split of the optimizer state and of its collectives.
#include "planner_impl.hpp"

#include "h2/core/error.hpp"
#include "h2/core/plan.hpp"

#include <algorithm>

namespace h2::scheduler {

planner::impl::simulator_input planner::impl::pipelines_of(const plan& p) {
  const std::size_t R = p.replicas.size();
  auto chip_of = [&](const chip_id& id) {
    const chip_spec* c = job->find_chip(id);
    if (c == nullptr)
      throw config_error("plan", "no chip " + id.to_string() + " in the job");
    return c;
  };
  simulator_input out;
  for (std::size_t r = 0; r < R; ++r) {
    const auto& rep = p.replicas[r];
    simulated_pipeline sp;
    sp.kind = p.schedule;
    sp.micro_batches = rep.micro_batches;
    sp.layout = layout_of(rep);
    const std::size_t n = rep.stages.size();
    for (std::size_t s = 0; s < n; ++s) {
      const auto& st = rep.stages[s];
      const chip_spec& chip = *chip_of(st.chip);
      const stage_cost c = costs
                             .stage(chip, st.first_layer, st.end_layer,
                                    rep.micro_batch_size, st.recompute)
                             .sharded(p.zero1 ? static_cast<int>(R) : 1);
      simulated_stage x;
      x.forward_seconds = c.forward_seconds;
      x.backward_seconds = c.backward_seconds;
      x.input_seconds = c.input_seconds;
      x.weight_seconds = c.weight_seconds;
      x.optimizer_seconds = c.optimizer_seconds;
      x.static_bytes = c.static_bytes;
      x.held_bytes = c.held_bytes;
      x.working_bytes = c.working_bytes;
      x.optimizer_working_bytes =
        R > 1 ? std::max(c.optimizer_working_bytes, c.reduction_working_bytes)
              : c.optimizer_working_bytes;
      x.capacity_bytes = costs.capacity_bytes(chip);
      // Between chunks of one chip nothing crosses a link.
      if (s > 0 && rep.stages[s - 1].chip != st.chip)
        x.activation_link_seconds = costs.boundary_seconds(
          *chip_of(rep.stages[s - 1].chip), chip, rep.micro_batch_size);
      if (s + 1 < n && rep.stages[s + 1].chip != st.chip)
        x.gradient_link_seconds = costs.boundary_seconds(
          *chip_of(rep.stages[s + 1].chip), chip, rep.micro_batch_size);
      sp.stages.push_back(x);
    }
    out.pipelines.push_back(std::move(sp));
  }
  // Reduction groups: what the runtime reduces together (core/plan.hpp,
  // reduction_groups()), in layer order; member r is a chip of replica r.
  for (const auto& group : reduction_groups(p)) {
    simulated_reduction red;
    std::vector<const chip_spec*> ring;
    for (std::size_t r = 0; r < group.members.size(); ++r) {
      const auto chips = replica_chips(p.replicas[r]);
      const auto held = std::find(chips.begin(), chips.end(), group.members[r]);
      H2_ENFORCE(held != chips.end(), "reduction group member ",
                 group.members[r].to_string(), " is no chip of replica ", r);
      red.members.emplace_back(static_cast<int>(r),
                               static_cast<int>(held - chips.begin()));
      ring.push_back(chip_of(group.members[r]));
    }
    red.seconds = costs.allreduce_seconds(ring, group.first_layer,
                                          group.end_layer, p.zero1);
    if (p.zero1) {
      // The reduce-scatter ends the phase; each member gathers the updated
      // parameters after its update (stage_worker::apply_update).
      const double scatter =
        costs.allreduce_seconds(ring, group.first_layer, group.end_layer) / 2;
      for (const auto& [r, position] : red.members) {
        const auto& rep = p.replicas[static_cast<std::size_t>(r)];
        for (std::size_t s = 0; s < rep.stages.size(); ++s)
          if (rep.stages[s].chip ==
              group.members[static_cast<std::size_t>(r)]) {
            out.pipelines[static_cast<std::size_t>(r)]
              .stages[s]
              .optimizer_seconds += red.seconds - scatter;
            break;
          }
      }
      red.seconds = scatter;
    }
    out.reductions.push_back(std::move(red));
  }
  return out;
}

} // namespace h2::scheduler
