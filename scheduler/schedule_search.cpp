// HeteroAuto over every schedule (docs/planner.md, "Choosing a schedule"):
// each planned alone, the fastest kept; interleaved-1f1b and zb-hetero's
// layouts of several chunks per chip from HeteroAuto's one-chunk plans,
// their boundaries improved on the simulator.
#include "h2/scheduler/plan_builder.hpp"
#include "h2/scheduler/planner.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

namespace h2::scheduler {

namespace {

/// The deepest replica whose stage boundaries improve_boundaries() moves
/// (each round simulates 2 (n - 1) moves).
constexpr int max_climbed = 16;

/// A plan built from `base` (its chips given several chunks, its
/// boundaries moved) keeps what base's stage-1 search found: the layouts,
/// the shape in words, the chips left idle and why, the ranking. The
/// simulator's report of the new plan knows none of it. Best found, not
/// proven optimal.
void keep_search(const plan_report& base, plan_report& rebuilt) {
  rebuilt.candidates = base.candidates;
  rebuilt.shape = base.shape;
  rebuilt.idle_chips = base.idle_chips;
  rebuilt.idle_reason = base.idle_reason;
  rebuilt.all_chips_step_seconds = base.all_chips_step_seconds;
  rebuilt.ranking = base.ranking;
  rebuilt.proven_optimal = false;
}

/// One step up the recomputation a stage of `blocks` transformer blocks
/// may use under `levels`: the attention cores, then one whole block more,
/// then the whole stage. False when there is none.
bool recompute_more(recompute_policy& rc, int blocks, recompute_levels levels) {
  if (rc.full || levels == recompute_levels::none)
    return false;
  const int whole = std::min(rc.blocks, blocks);
  if (levels == recompute_levels::selective && whole < blocks) {
    if (!rc.attention)
      rc.attention = true;
    else
      rc.blocks = whole + 1;
    return true;
  }
  rc = recompute_policy::whole();
  return true;
}

/// `q` (chips dealt several chunks, or a chip given a second) with the
/// recomputation of each chip over its memory raised a step at a time,
/// one of its stages per round, until `q` fits or nothing more can be
/// recomputed: chunks hold more micro-batches at once than the 1F1B stages
/// they come from, and the 1F1B plan's recomputation left no room for that.
/// The stage raised is the chip's with the most blocks not yet recomputed
/// whole (the largest activations). Returns q's report.
plan_report fit_by_recomputing(planner& p, plan& q, plan_report report,
                               recompute_levels levels,
                               const gpt_config& model) {
  while (!report.fits) {
    bool raised = false;
    for (std::size_t r = 0; r < q.replicas.size(); ++r) {
      auto& stages = q.replicas[r].stages;
      auto blocks = [&](std::size_t s) {
        return stage_layers::of(model, stages[s].first_layer,
                                stages[s].end_layer)
          .blocks;
      };
      auto open = [&](std::size_t s) {
        const auto& rc = stages[s].recompute;
        return rc.full ? -1 : blocks(s) - std::min(rc.blocks, blocks(s));
      };
      std::map<chip_id, std::size_t> chosen;
      for (std::size_t s = 0; s < stages.size(); ++s) {
        const auto& predicted = report.replicas[r].stages[s];
        if (predicted.peak_bytes <= predicted.capacity_bytes)
          continue;
        auto [at, fresh] = chosen.try_emplace(stages[s].chip, s);
        if (!fresh && open(s) > open(at->second))
          at->second = s;
      }
      for (const auto& [chip, s] : chosen)
        raised =
          recompute_more(stages[s].recompute, blocks(s), levels) || raised;
    }
    if (!raised)
      break;
    report = p.evaluate(q);
  }
  return report;
}

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

/// The 1F1B plans interleaving starts from: HeteroAuto's, and, when that
/// has fewer micro-batches than chips in a pipeline (interleaving needs as
/// many), HeteroAuto's with micro-batches small enough. Adds the
/// simulations they took to `simulations`.
std::vector<planned> one_f_one_b_bases(const job_config& job,
                                       chip_measurements& measurements,
                                       const planner_options& o,
                                       std::size_t& simulations) {
  planner p(job, measurements, o);
  std::vector<planned> bases{p.run()};
  simulations += p.simulations();
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
      // Nothing fits with smaller micro-batches: the first base stands.
    }
  }
  return bases;
}

/// Why no 1F1B plan of `bases` could be interleaved, as an infeasible_error.
infeasible_error not_interleaved(const job_config& job,
                                 const std::vector<planned>& bases) {
  const std::string shape = "interleaved-1f1b: HeteroAuto's 1F1B plan (" +
                            bases.front().report.shape + ")";
  int longest = 0;
  for (const auto& base : bases)
    for (const auto& r : base.value.replicas)
      longest = std::max(longest, static_cast<int>(r.stages.size()));
  if (longest * 2 > job.model.num_layers())
    return infeasible_error(
      shape + " pipelines over " + std::to_string(longest) +
        " chips, and the model's " + std::to_string(job.model.num_layers()) +
        " layers cannot give each of them 2 chunks",
      std::nullopt);
  return infeasible_error(
    shape + " cannot be dealt into " +
      (job.plan.chunks_given ? std::to_string(job.plan.chunks_per_chip)
                             : std::string("2 to 4")) +
      " chunks per chip that fit: a replica has one chip or fewer "
      "micro-batches than chips, or the chunks' activations outgrow a "
      "chip's memory",
    std::nullopt);
}

/// interleaved-1f1b: a 1F1B plan of HeteroAuto's (chips, their layers,
/// micro-batching, recomputation) with each chip's layers dealt into v
/// chunks (deal_chunks()), v as the job says (plan.chunks_per_chip) or 2
/// to 4, its boundaries improved on the simulator; the fastest that fits.
/// Not proven optimal: a local search, with no bound.
planned plan_interleaved(const job_config& job, chip_measurements& measurements,
                         const planner_options& options) {
  planner_options o = options;
  o.schedule = schedule_kind::one_f_one_b;
  o.search_schedules = false;
  std::size_t simulations = 0;
  const auto bases = one_f_one_b_bases(job, measurements, o, simulations);
  planner p(job, measurements, o);
  const std::vector<int> tried = job.plan.chunks_given
                                   ? std::vector<int>{job.plan.chunks_per_chip}
                                   : std::vector<int>{2, 3, 4};
  std::optional<planned> best;
  for (const auto& base : bases)
    for (int v : tried) {
      auto dealt = deal_chunks(base.value, v);
      if (!dealt)
        continue; // one chip, or too few layers
      dealt->schedule = schedule_kind::interleaved_1f1b;
      bool runs = true;
      for (const auto& r : dealt->replicas)
        runs =
          runs && layout_problem(dealt->schedule, layout_of(r), r.micro_batches)
                    .empty();
      if (!runs)
        continue; // fewer micro-batches than chips
      auto report = fit_by_recomputing(p, *dealt, p.evaluate(*dealt),
                                       o.recompute, job.model);
      if (!report.fits)
        continue;
      auto tried_plan =
        improve_boundaries(p, planned{std::move(*dealt), std::move(report)});
      if (!best || tried_plan.report.step_seconds < best->report.step_seconds) {
        best = std::move(tried_plan);
        keep_search(base.report, best->report);
      }
    }
  if (!best)
    throw not_interleaved(job, bases);
  best->report.simulations = simulations + p.simulations();
  for (const auto& base : bases) // each planner measures with its own cache
    best->report.measurements += base.report.measurements;
  return std::move(*best);
}

/// `p` with the boundary between stages s and s + 1 of replica r moved by
/// `delta` layers; nullopt when a stage would be left without layers.
std::optional<plan> shifted(const plan& p, std::size_t r, std::size_t s,
                            int delta) {
  plan out = p;
  auto& a = out.replicas[r].stages[s];
  auto& b = out.replicas[r].stages[s + 1];
  a.end_layer += delta;
  b.first_layer += delta;
  if (a.num_layers() < 1 || b.num_layers() < 1)
    return std::nullopt;
  return out;
}

} // namespace

planned improve_boundaries(planner& p, planned start) {
  for (int round = 0; round < 4 * max_climbed; ++round) {
    std::optional<planned> step;
    for (std::size_t r = 0; r < start.value.replicas.size(); ++r) {
      const auto n = start.value.replicas[r].stages.size();
      if (n > static_cast<std::size_t>(max_climbed))
        continue;
      for (std::size_t s = 0; s + 1 < n; ++s)
        for (int delta : {-1, 1}) {
          auto moved = shifted(start.value, r, s, delta);
          if (!moved)
            continue;
          auto report = p.evaluate(*moved);
          const double to_beat =
            step ? step->report.step_seconds : start.report.step_seconds;
          if (report.fits && report.step_seconds < to_beat * (1 - 1e-9))
            step = planned{std::move(*moved), std::move(report)};
        }
    }
    if (!step)
      break;
    start.value = std::move(step->value);
    start.report = std::move(step->report);
  }
  return start;
}

namespace {

/// zb-hetero: HeteroAuto's plan (one chunk per chip), then, in pipelines of
/// up to max_climbed chips, each chip in turn given a second chunk at the
/// pipeline's end (half its layers; the layout dealt({1, .., 2, .., 1})),
/// and every chip two chunks (deal_chunks()), each with its boundaries
/// improved on the simulator; the fastest kept. A plan with a second chunk
/// is best found, not proven optimal.
planned plan_zb_hetero(const job_config& job, chip_measurements& measurements,
                       const planner_options& options) {
  planner p(job, measurements, options);
  planned best = p.run();
  const std::size_t simulations = p.simulations();
  const plan base = best.value;
  for (std::size_t r = 0; r < base.replicas.size(); ++r) {
    const auto& stages = base.replicas[r].stages;
    if (stages.size() < 2 || stages.size() > max_climbed)
      continue;
    for (std::size_t k = 0; k < stages.size(); ++k) {
      // Chip k's later half of layers becomes the last chunk (of the best
      // plan so far, whose boundaries may have moved).
      plan q = best.value;
      auto& st = q.replicas[r].stages;
      if (st[k].num_layers() < 2)
        continue;
      const int moved = st[k].num_layers() / 2;
      std::vector<int> counts;
      for (const auto& s : st)
        counts.push_back(s.num_layers());
      counts[k] -= moved;
      counts.push_back(moved);
      st.push_back(st[k]);
      int next = 0;
      for (std::size_t s = 0; s < st.size(); ++s) {
        st[s].first_layer = next;
        st[s].end_layer = next += counts[s];
      }
      if (st[st.size() - 2].chip == st.back().chip)
        continue; // the last chip's own stage: nothing to gain
      auto report =
        fit_by_recomputing(p, q, p.evaluate(q), options.recompute, job.model);
      if (!report.fits)
        continue;
      auto tried =
        improve_boundaries(p, planned{std::move(q), std::move(report)});
      if (tried.report.step_seconds < best.report.step_seconds * (1 - 1e-9)) {
        keep_search(best.report, tried.report);
        best = std::move(tried);
      }
    }
  }
  // Every chip of two chunks, dealt (ZB-H1's split on interleaved chunks).
  if (auto dealt = deal_chunks(base, 2)) {
    auto report = fit_by_recomputing(p, *dealt, p.evaluate(*dealt),
                                     options.recompute, job.model);
    if (report.fits) {
      auto tried =
        improve_boundaries(p, planned{std::move(*dealt), std::move(report)});
      if (tried.report.step_seconds < best.report.step_seconds * (1 - 1e-9)) {
        keep_search(best.report, tried.report);
        best = std::move(tried);
      }
    }
  }
  best.report.simulations = simulations + p.simulations();
  return best;
}

/// "2.5%" for 0.025.
std::string percent_text(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", 100.0 * fraction);
  return text;
}

/// One schedule's plan, with the job's ZeRO-1 setting.
planned plan_schedule(const job_config& job, chip_measurements& measurements,
                      const planner_options& options) {
  switch (options.schedule.value_or(job.plan.schedule)) {
    case schedule_kind::interleaved_1f1b:
      return plan_interleaved(job, measurements, options);
    case schedule_kind::zb_hetero:
      return plan_zb_hetero(job, measurements, options);
    case schedule_kind::gpipe:
    case schedule_kind::one_f_one_b:
    case schedule_kind::zb_h1:
      break;
  }
  planner p(job, measurements, options);
  return p.run();
}

/// One schedule's plan. ZeRO-1 is a lever: with reductions in another
/// dtype than fp32 its parameter all-gather (fp32) moves more bytes than
/// the all-reduce's second half, so the plan without it is planned too and
/// the faster kept; with fp32 reductions it moves the same bytes and saves
/// memory and update time, and is kept (docs/planner.md, "Sharded optimizer
/// state").
planned plan_one(const job_config& job, chip_measurements& measurements,
                 const planner_options& options) {
  planned best = plan_schedule(job, measurements, options);
  // Also when the sharded search chose one replica: replicas without
  // ZeRO-1 may beat it.
  if (!job.plan.zero1 || job.transport.reduce_dtype == dtype::fp32)
    return best;
  job_config unsharded = job;
  unsharded.plan.zero1 = false;
  planner_options quiet = options; // no change to suggest if none fits
  quiet.suggest_changes = false;
  std::optional<planned> other;
  try {
    other = plan_schedule(unsharded, measurements, quiet);
  } catch (const infeasible_error&) {
  }
  const double sharded_step = best.report.step_seconds;
  const std::size_t simulations =
    best.report.simulations + (other ? other->report.simulations : 0);
  if (other && other->report.step_seconds < sharded_step * (1 - 1e-9)) {
    other->report.simulations = simulations;
    other->report.zero1_reason =
      "off: the plan without it is predicted " +
      percent_text(sharded_step / other->report.step_seconds - 1) +
      " faster (its fp32 parameter all-gather moves more than the " +
      std::string(to_string(job.transport.reduce_dtype)) +
      " all-reduce it replaces)";
    return std::move(*other);
  }
  best.report.simulations = simulations;
  if (!best.value.zero1)
    return best; // one replica either way: nothing was sharded
  best.report.zero1_reason =
    other ? "on: the plan without it is predicted " +
              percent_text(other->report.step_seconds / sharded_step - 1) +
              " slower"
          : std::string("on: no plan without it fits");
  return best;
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
