// Stage 2 of HeteroAuto: layers per stage, micro-batch size and count,
// recomputation, for one replica layout (docs/planner.md, "Stage 2").
//
// One group of identical replicas: branch and bound over the stages' layer
// ranges in pipeline order (stage_two_branch_bound.cpp), with lower bounds
// from paths of the schedule's precedence graph (stage_two_bounds.cpp) and
// the simulator at the leaves (stage_two_search.cpp), seeded by a
// bottleneck-balancing heuristic improved by local search
// (stage_two_heuristic.cpp). Several groups: every (partition, micro-batch
// size) of every group and every split of the batch between groups when
// that is few enough, else a heuristic split (stage_two_groups.cpp).
//
// Recomputation is not searched: the simulated step time never decreases
// when an op gets longer (the simulator takes maxima and sums), and
// recomputation only lengthens a stage's backward while it only lowers its
// memory, so a stage recomputes exactly when it does not fit otherwise, and
// then the least that fits (stage_coefficients::fitting: of the policies
// it tries, the one that adds the least time).
#include "stage_two_impl.hpp"

namespace h2::scheduler {

stage_two_result planner::impl::stage_two(const pipeline_candidate& c,
                                          double bound) {
  const std::size_t simulations_before =
    pipeline_simulator.runs() + simulations;
  stage_two_result out =
    c.groups.size() == 1
      ? stage_two_detail::solve_one_group(*this, c.groups.front(), bound)
      : stage_two_detail::solve_groups(*this, c, bound);
  out.simulations =
    pipeline_simulator.runs() + simulations - simulations_before;
  return out;
}

} // namespace h2::scheduler
