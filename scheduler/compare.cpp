#include "h2/scheduler/compare.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

namespace h2::scheduler {

namespace {

std::string percent(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * x);
  return buf;
}

/// A part of the cluster's share of the global batch: in proportion to its
/// chips, at least one sequence (docs/planner.md, "The super-linear
/// ratio").
int batch_share(int global_batch, std::size_t chips, std::size_t all) {
  return std::max<int>(
    1, static_cast<int>(std::lround(static_cast<double>(global_batch) *
                                    static_cast<double>(chips) /
                                    static_cast<double>(all))));
}

/// HeteroAuto's plan of `ids` alone training `batch` sequences per step,
/// with `options` otherwise.
baseline plan_alone(const job_config& job, chip_measurements& measurements,
                    const planner_options& options, std::string name,
                    const std::vector<chip_id>& ids, int batch) {
  baseline b;
  b.name = std::move(name);
  b.chips = static_cast<int>(ids.size());
  job_config part = job;
  part.train.global_batch = batch;
  b.global_batch = batch;
  planner_options o = options;
  o.chips = ids;
  o.suggest_changes = true; // asked only when nothing fits
  o.rank_candidates = false;
  try {
    auto r = plan_auto(part, measurements, o);
    b.feasible = true;
    b.step_seconds = r.report.step_seconds;
    b.tokens_per_second = r.report.tokens_per_second;
    b.shape = r.report.shape;
    o.schedule = r.report.schedule;
    planner costs(part, measurements, o);
    b.binding = binding_constraints(costs, r.report);
    b.value = std::move(r.value);
  } catch (const infeasible_error& e) {
    b.why_not = "the model does not fit: " + e.problem();
    b.lever = e.change()
                ? e.change()->describe() + " (checked: then a plan fits, " +
                    seconds_text(e.change()->step_seconds) + " per step)"
                : "no single change the planner checks (recomputation, "
                  "smaller micro-batches, more chips of a kind present) "
                  "lets it";
  }
  return b;
}

} // namespace

std::string binding_constraints(planner& pl, const plan_report& r) {
  double compute = 0, again = 0;
  int stages = 0, recomputing = 0;
  for (const auto& rep : r.replicas)
    for (const auto& st : rep.stages) {
      ++stages;
      compute += st.compute_seconds;
      if (!st.recompute.any())
        continue;
      ++recomputing;
      const chip_spec& chip = *pl.costs().job().find_chip(st.chip);
      auto cost = [&](const recompute_policy& p) {
        return pl.costs()
          .stage(chip, st.first_layer, st.end_layer, rep.micro_batch_size, p)
          .backward_seconds;
      };
      again += (cost(st.recompute) - cost({})) * rep.micro_batches;
    }
  const double memory = compute > 0 ? again / compute : 0;
  const double links =
    r.step_seconds > 0 ? r.allreduce_seconds / r.step_seconds : 0;
  // Micro-batch efficiency: a block's time per sequence at the plan's
  // micro-batch size against one micro-batch of the replica's sequences.
  const auto& r0 = r.replicas.front();
  const int mu = r0.micro_batch_size, whole = mu * r0.micro_batches;
  const chip_spec& first = *pl.costs().job().find_chip(r0.stages.front().chip);
  const double per_sequence =
    pl.costs().coefficients(first, mu).block.forward_seconds / mu;
  const double best_per_sequence =
    pl.costs().coefficients(first, whole).block.forward_seconds / whole;
  const double small = best_per_sequence > 0
                         ? std::max(0.0, per_sequence / best_per_sequence - 1)
                         : 0.0;
  std::vector<std::pair<double, std::string>> losses{
    {r.bubble_fraction,
     "bubble (" + percent(r.bubble_fraction) + " of the pipeline phase idle)"},
    {memory, "memory (" + std::to_string(recomputing) + " of " +
               std::to_string(stages) + " stages recompute, +" +
               percent(memory) + " compute; headroom " +
               percent(r.memory_headroom) + "; micro-batches of " +
               std::to_string(mu) + ")"},
    {links, "links (all-reduce up to " + percent(links) + " of the step)"},
    {small, "micro-batch efficiency (" + std::to_string(mu) + " sequence" +
              (mu == 1 ? "" : "s") + " per micro-batch: +" + percent(small) +
              " time per sequence over " + std::to_string(whole) + ")"}};
  std::stable_sort(losses.begin(), losses.end(),
                   [](auto& a, auto& b) { return a.first > b.first; });
  std::string out = losses.front().second;
  for (std::size_t i = 1; i < losses.size(); ++i)
    out += (i == 1 ? "; then " : ", ") + losses[i].second;
  return out;
}

comparison compare_with_baselines(const job_config& job,
                                  chip_measurements& measurements,
                                  const planner_options& options,
                                  const plan_report& best) {
  comparison out;
  planner pl(job, measurements, options);
  const auto& chips = pl.chips();

  // The even plan over the same chips, as plan.mode = "even" would run it.
  std::vector<chip_id> planned_chips;
  for (const auto* c : chips)
    planned_chips.push_back(c->id);
  out.even.name = "even (" + std::to_string(chips.size()) +
                  " stages, micro-batch " +
                  std::to_string(job.train.micro_batch) + ")";
  out.even.chips = static_cast<int>(chips.size());
  out.even.global_batch = job.train.global_batch;
  if (static_cast<int>(chips.size()) * job.plan.chunks_per_chip >
      job.model.num_layers()) {
    out.even.why_not = "more chunks than layers";
  } else {
    out.even.value = even_plan(job, planned_chips);
    auto r = pl.evaluate(out.even.value);
    out.even.feasible = r.fits;
    out.even.step_seconds = r.step_seconds;
    out.even.tokens_per_second = r.tokens_per_second;
    if (!r.fits)
      out.even.why_not = "a stage exceeds its memory";
  }

  // Each chip kind alone, with its share of the batch.
  std::map<std::string, std::vector<chip_id>> kinds;
  for (const auto* c : chips)
    kinds[chip_kind_key(*c)].push_back(c->id);
  std::vector<chip_id> trainable_chips;
  int trainable_batch = 0;
  for (const auto& [kind, ids] : kinds) {
    const int batch =
      batch_share(job.train.global_batch, ids.size(), chips.size());
    auto b = plan_alone(job, measurements, options, kind, ids, batch);
    if (b.feasible) {
      out.homogeneous_tokens_per_second += b.tokens_per_second;
      trainable_chips.insert(trainable_chips.end(), ids.begin(), ids.end());
      trainable_batch += batch;
    }
    out.homogeneous.push_back(std::move(b));
  }
  if (out.homogeneous_tokens_per_second <= 0)
    return out;
  out.super_linear_ratio =
    best.tokens_per_second / out.homogeneous_tokens_per_second;
  out.trainable_ratio = out.super_linear_ratio;
  if (trainable_chips.size() < chips.size()) {
    out.trainable =
      plan_alone(job, measurements, options, "the kinds that train alone",
                 trainable_chips, trainable_batch);
    out.trainable_ratio =
      out.trainable->feasible
        ? out.trainable->tokens_per_second / out.homogeneous_tokens_per_second
        : 0;
  }
  return out;
}

job_config sub_cluster(const job_config& full, int stride) {
  H2_ENFORCE(stride >= 1, "stride=", stride);
  job_config job = full;
  job.nodes.clear();
  job.plan.stages.clear();
  int rank = 0;
  for (std::size_t n = 0; n < full.nodes.size();
       n += static_cast<std::size_t>(stride)) {
    node_spec node = full.nodes[n];
    node.rank = rank;
    for (auto& c : node.chips) {
      c.id.node = rank;
      job.plan.stages.push_back(c.id);
    }
    job.nodes.push_back(std::move(node));
    ++rank;
  }
  job.train.global_batch = std::max(1, full.train.global_batch / stride);
  return job;
}

} // namespace h2::scheduler
