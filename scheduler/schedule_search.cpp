// HeteroAuto over every schedule (docs/planner.md, "Choosing a schedule"):
// each planned alone, the fastest kept; interleaved-1f1b from HeteroAuto's
// 1F1B plan, its chips' layers dealt into chunks.
#include "h2/scheduler/plan_builder.hpp"
#include "h2/scheduler/planner.hpp"

#include <algorithm>

namespace h2::scheduler {

namespace {

/// The longest pipeline whose dealt layer counts interleaved-1f1b's
/// planning improves by moving layers (each round simulates n^2 moves).
constexpr int max_climbed = 16;

/// Micro-batch sizes at most `cap`, of those `options` allows.
std::vector<int> sizes_up_to(int cap, const planner_options& options) {
  std::vector<int> out;
  for (int mu = 1; mu <= cap; ++mu)
    if (options.micro_batch_sizes.empty() ||
        std::find(options.micro_batch_sizes.begin(),
                  options.micro_batch_sizes.end(),
                  mu) != options.micro_batch_sizes.end())
      out.push_back(mu);
  return out;
}

/// interleaved-1f1b: HeteroAuto's 1F1B plan (chips, their layers,
/// micro-batching, recomputation) with each chip's layers dealt into v
/// chunks (deal_chunks()); v as the job says (plan.chunks_per_chip) or the
/// fastest of 2 to 4 that fits, then each chip's count of layers improved
/// one move at a time on the simulator. When the 1F1B plan has fewer
/// micro-batches than chips in a pipeline (interleaving needs as many),
/// HeteroAuto plans 1F1B again with micro-batches small enough. Not proven
/// optimal: a local search, with no bound.
planned plan_interleaved(const job_config& job, chip_measurements& measurements,
                         const planner_options& options) {
  planner_options o = options;
  o.schedule = schedule_kind::one_f_one_b;
  o.search_schedules = false;
  planner p(job, measurements, o);
  std::vector<planned> bases{p.run()};
  std::size_t simulations = p.simulations();
  int cap = job.train.global_batch;
  bool too_few = false;
  for (const auto& r : bases.front().value.replicas) {
    const int chips = static_cast<int>(replica_chips(r).size());
    cap = std::min(cap, r.sequences() / chips);
    too_few = too_few || r.micro_batches < chips;
  }
  if (too_few && !sizes_up_to(cap, o).empty()) {
    planner_options smaller = o;
    smaller.micro_batch_sizes = sizes_up_to(cap, o);
    try {
      planner q(job, measurements, smaller);
      bases.push_back(q.run());
      simulations += q.simulations();
    } catch (const infeasible_error&) {
    }
  }
  const std::vector<int> tried = job.plan.chunks_given
                                   ? std::vector<int>{job.plan.chunks_per_chip}
                                   : std::vector<int>{2, 3, 4};
  // The prediction of `single`'s layers dealt into v chunks, if it runs.
  auto dealt_of = [&](const plan& single, int v) -> std::optional<planned> {
    auto dealt = deal_chunks(single, v);
    if (!dealt)
      return std::nullopt; // one chip, or too few layers
    dealt->schedule = schedule_kind::interleaved_1f1b;
    for (const auto& r : dealt->replicas)
      if (!layout_problem(dealt->schedule, layout_of(r), r.micro_batches)
             .empty())
        return std::nullopt; // fewer micro-batches than chips
    auto report = p.evaluate(*dealt);
    if (!report.fits)
      return std::nullopt;
    return planned{std::move(*dealt), std::move(report)};
  };
  std::optional<planned> best;
  for (const auto& base : bases)
    for (int v : tried) {
      plan single = base.value;
      auto current = dealt_of(single, v);
      // Chunks change what balances the chips: move one layer at a time
      // between two chips of a replica while the prediction improves
      // (pipelines of up to max_climbed chips).
      for (int round = 0; current && round < 4 * max_climbed; ++round) {
        std::optional<std::pair<plan, planned>> step;
        for (std::size_t r = 0; r < single.replicas.size(); ++r) {
          const int n = static_cast<int>(single.replicas[r].stages.size());
          if (n > max_climbed)
            continue;
          for (int a = 0; a < n; ++a)
            for (int b = 0; b < n; ++b) {
              auto moved = move_layer(single, static_cast<int>(r), a, b);
              auto e = moved ? dealt_of(*moved, v) : std::nullopt;
              const double to_beat = step ? step->second.report.step_seconds
                                          : current->report.step_seconds;
              if (e && e->report.step_seconds < to_beat * (1 - 1e-9))
                step.emplace(std::move(*moved), std::move(*e));
            }
        }
        if (!step)
          break;
        single = std::move(step->first);
        current = std::move(step->second);
      }
      if (current &&
          (!best || current->report.step_seconds < best->report.step_seconds)) {
        best = std::move(current);
        best->report.candidates = base.report.candidates;
        best->report.shape = base.report.shape;
      }
    }
  int longest = 0;
  for (const auto& base : bases)
    for (const auto& r : base.value.replicas)
      longest = std::max(longest, static_cast<int>(r.stages.size()));
  if (!best && longest * 2 > job.model.num_layers())
    throw infeasible_error("interleaved-1f1b: HeteroAuto's 1F1B plan (" +
                             bases.front().report.shape + ") pipelines over " +
                             std::to_string(longest) +
                             " chips, and the model's " +
                             std::to_string(job.model.num_layers()) +
                             " layers cannot give each of them 2 chunks",
                           std::nullopt);
  if (!best)
    throw infeasible_error(
      "interleaved-1f1b: HeteroAuto's 1F1B plan (" +
        bases.front().report.shape + ") cannot be dealt into " +
        (job.plan.chunks_given ? std::to_string(job.plan.chunks_per_chip)
                               : std::string("2 to 4")) +
        " chunks per chip that fit: a chip holds too few layers, a "
        "replica has fewer micro-batches than chips, or the chunks' "
        "activations outgrow a chip's memory",
      std::nullopt);
  best->report.simulations = simulations + p.simulations();
  best->report.proven_optimal = false;
  return std::move(*best);
}

/// One schedule's plan.
planned plan_one(const job_config& job, chip_measurements& measurements,
                 const planner_options& options) {
  if (options.schedule.value_or(job.plan.schedule) ==
      schedule_kind::interleaved_1f1b)
    return plan_interleaved(job, measurements, options);
  planner p(job, measurements, options);
  return p.run();
}

} // namespace

bool searches_schedules(const job_config& job,
                        const planner_options& options) noexcept {
  return options.search_schedules ||
         (!options.schedule && job.plan.search_schedule);
}

std::vector<schedule_choice>
plan_each_schedule(const job_config& job, chip_measurements& measurements,
                   const planner_options& options) {
  std::vector<schedule_choice> out;
  for (auto kind : all_schedule_kinds) {
    planner_options o = options;
    o.schedule = kind;
    o.search_schedules = false;
    schedule_choice c;
    c.schedule = kind;
    try {
      c.result = plan_one(job, measurements, o);
    } catch (const infeasible_error&) {
      c.error = std::current_exception();
    }
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    if (a.result.has_value() != b.result.has_value())
      return a.result.has_value();
    return a.result &&
           a.result->report.step_seconds < b.result->report.step_seconds;
  });
  return out;
}

planned plan_auto(const job_config& job, chip_measurements& measurements,
                  const planner_options& options) {
  if (!searches_schedules(job, options))
    return plan_one(job, measurements, options);
  auto choices = plan_each_schedule(job, measurements, options);
  if (choices.front().result)
    return std::move(*choices.front().result);
  for (const auto& c : choices)
    if (c.schedule == schedule_kind::one_f_one_b)
      std::rethrow_exception(c.error);
  std::rethrow_exception(choices.front().error);
}

} // namespace h2::scheduler
