#include "h2/scheduler/planner.hpp"

#include "planner_impl.hpp"

#include "h2/core/error.hpp"
#include "h2/core/plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

namespace h2::scheduler {

namespace {

constexpr double gib = 1024.0 * 1024.0 * 1024.0;

std::string format(const char* fmt, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, a);
  return buf;
}

std::string chip_text(const chip_spec& c) {
  return c.id.to_string() + " (" + c.profile.name + ")";
}

} // namespace

// ---------------------------------------------------------------------------
// impl

planner::impl::impl(const job_config& j, chip_measurements& m,
                    planner_options opt)
    : job(&j),
      options(std::move(opt)),
      pipeline_schedule(options.schedule.value_or(j.plan.schedule)),
      costs(j, m) {
  std::vector<chip_id> ids = options.chips;
  if (ids.empty()) {
    if (j.plan.mode == plan_mode::automatic && !j.plan.stages.empty())
      ids = j.plan.stages;
    else
      for (const auto* c : j.chips())
        ids.push_back(c->id);
  }
  std::set<chip_id> seen;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const chip_spec* c = j.find_chip(ids[i]);
    if (c == nullptr)
      throw config_error("plan.stages[" + std::to_string(i) + "]",
                         "no chip " + ids[i].to_string() + " in [[nodes]]");
    if (seen.insert(ids[i]).second)
      chips.push_back(c);
  }
  if (chips.empty())
    throw config_error("plan.stages", "no chips to plan for");
  std::sort(chips.begin(), chips.end(),
            [](auto* a, auto* b) { return a->id < b->id; });
  std::map<std::pair<std::string, double>, int> index;
  for (const auto* c : chips) {
    auto key = std::make_pair(chip_kind_key(*c), costs.capacity_bytes(*c));
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, static_cast<int>(class_name.size())).first;
      std::string name = c->profile.name;
      for (const auto& n : class_name)
        if (n == name) // same profile in two dtypes or capacities
          name =
            c->profile.name + "/" + std::string(to_string(c->compute_dtype));
      class_name.push_back(name);
      class_capacity_bytes.push_back(key.second);
      class_members.emplace_back();
    }
    chip_class.push_back(it->second);
    class_members[static_cast<std::size_t>(it->second)].push_back(
      static_cast<int>(chip_class.size()) - 1);
  }
  H2_ENFORCE(j.train.global_batch >= 1, "global_batch=", j.train.global_batch);
}

std::vector<int> planner::impl::micro_batch_sizes(int seqs) const {
  std::vector<int> out;
  for (int mu = 1; mu <= seqs; ++mu) {
    if (seqs % mu != 0)
      continue;
    if (!options.micro_batch_sizes.empty() &&
        std::find(options.micro_batch_sizes.begin(),
                  options.micro_batch_sizes.end(),
                  mu) == options.micro_batch_sizes.end())
      continue;
    out.push_back(mu);
  }
  return out;
}

simulation planner::impl::simulate_plan(const plan& p, bool timeline) {
  simulations += p.replicas.size();
  auto in = pipelines_of(p);
  return scheduler::simulate(in.pipelines, in.reductions, timeline);
}

plan_report planner::impl::report_of(const plan& p, simulation sim) {
  plan_report rep;
  rep.schedule = p.schedule;
  rep.zero1 = p.shards_optimizer();
  rep.step_seconds = sim.step_seconds;
  rep.pipeline_seconds = sim.pipeline_seconds;
  rep.allreduce_seconds = sim.allreduce_seconds;
  rep.optimizer_seconds = sim.optimizer_seconds;
  rep.bubble_fraction = sim.bubble_fraction;
  rep.fits = sim.fits;
  rep.tokens_per_second = sim.step_seconds > 0
                            ? static_cast<double>(p.global_batch()) *
                                job->model.seq_len / sim.step_seconds
                            : 0;
  double busiest = -1;
  rep.memory_headroom = std::numeric_limits<double>::infinity();
  for (std::size_t r = 0; r < p.replicas.size(); ++r) {
    const auto& rp = p.replicas[r];
    replica_prediction pr;
    pr.micro_batch_size = rp.micro_batch_size;
    pr.micro_batches = rp.micro_batches;
    const auto positions = stage_positions(rp); // the simulation's chips
    for (std::size_t s = 0; s < rp.stages.size(); ++s) {
      const auto& st = rp.stages[s];
      const auto& o = sim.replicas[r][static_cast<std::size_t>(positions[s])];
      const chip_spec& chip = *job->find_chip(st.chip);
      stage_prediction sp;
      sp.chip = st.chip;
      sp.device = chip.device;
      sp.first_layer = st.first_layer;
      sp.end_layer = st.end_layer;
      stage_cost c = costs.stage(chip, st.first_layer, st.end_layer,
                                 rp.micro_batch_size, st.recompute);
      // What the stage recomputes: a policy dealt to a chunk may name more
      // blocks than the chunk holds.
      sp.recompute = c.recompute;
      sp.forward_seconds = c.forward_seconds;
      sp.backward_seconds = c.backward_seconds;
      sp.compute_seconds = o.forward_seconds + o.backward_seconds;
      sp.idle_seconds = o.idle_seconds;
      sp.allreduce_seconds = o.allreduce_seconds;
      sp.optimizer_seconds = o.optimizer_seconds;
      sp.peak_bytes = o.peak_bytes;
      sp.capacity_bytes = costs.capacity_bytes(chip);
      sp.in_flight = o.peak_in_flight;
      if (sp.compute_seconds > busiest) {
        busiest = sp.compute_seconds;
        rep.binding_replica = static_cast<int>(r);
        rep.binding_stage = static_cast<int>(s);
      }
      double headroom =
        std::isinf(sp.capacity_bytes)
          ? 1.0
          : (sp.capacity_bytes - sp.peak_bytes) / sp.capacity_bytes;
      if (headroom < rep.memory_headroom) {
        rep.memory_headroom = headroom;
        rep.tightest_replica = static_cast<int>(r);
        rep.tightest_stage = static_cast<int>(s);
      }
      pr.stages.push_back(sp);
    }
    rep.replicas.push_back(std::move(pr));
  }
  rep.measurements = costs.measurements_taken();
  rep.sim = std::move(sim);
  return rep;
}

std::string planner::impl::describe(const pipeline_candidate& c) const {
  std::ostringstream out;
  for (std::size_t g = 0; g < c.groups.size(); ++g) {
    const auto& grp = c.groups[g];
    if (g > 0)
      out << " + ";
    out << grp.replicas.size() << " x [";
    const auto& chips_of = grp.replicas.front();
    for (std::size_t i = 0; i < chips_of.size();) {
      int k = chip_class[static_cast<std::size_t>(chips_of[i])];
      std::size_t j = i;
      while (j < chips_of.size() &&
             chip_class[static_cast<std::size_t>(chips_of[j])] == k)
        ++j;
      out << (i > 0 ? ", " : "") << class_name[static_cast<std::size_t>(k)];
      if (j - i > 1)
        out << " x" << (j - i);
      i = j;
    }
    out << "]";
  }
  return out.str();
}

// ---------------------------------------------------------------------------
// Public surface

std::string bytes_text(double b) {
  if (std::abs(b) >= gib)
    return format("%.1f GiB", b / gib);
  if (std::abs(b) >= 1024.0 * 1024.0)
    return format("%.1f MiB", b / (1024.0 * 1024.0));
  return format("%.1f KiB", b / 1024.0);
}

std::string seconds_text(double s) {
  if (s >= 1)
    return format("%.3f s", s);
  if (s >= 1e-3)
    return format("%.3f ms", s * 1e3);
  return format("%.3f us", s * 1e6);
}

int pipeline_candidate::replicas() const noexcept {
  int n = 0;
  for (const auto& g : groups)
    n += static_cast<int>(g.replicas.size());
  return n;
}

std::string plan_report::explain() const {
  std::ostringstream out;
  if (replicas.empty())
    return "";
  const auto& b = replicas[static_cast<std::size_t>(binding_replica)]
                    .stages[static_cast<std::size_t>(binding_stage)];
  out << "binding stage: replica " << binding_replica << " stage "
      << binding_stage << " on chip " << b.chip.to_string() << " (" << b.device
      << ", layers [" << b.first_layer << ", " << b.end_layer
      << ")): " << seconds_text(b.compute_seconds) << " of compute in a "
      << seconds_text(pipeline_seconds)
      << " pipeline phase; the other stages wait on it\n";
  const auto& t = replicas[static_cast<std::size_t>(tightest_replica)]
                    .stages[static_cast<std::size_t>(tightest_stage)];
  out << "memory: tightest chip " << t.chip.to_string() << " (" << t.device
      << ") at " << format("%.1f%%", 100.0 * t.peak_bytes / t.capacity_bytes)
      << " of " << bytes_text(t.capacity_bytes) << " with " << t.in_flight
      << " micro-batch" << (t.in_flight == 1 ? "" : "es") << " in flight"
      << (t.recompute.any() ? " (recomputing " + to_string(t.recompute) + ")"
                            : std::string())
      << "; headroom " << format("%.1f%%", 100.0 * memory_headroom) << "\n";
  int stages = 0;
  for (const auto& r : replicas)
    stages = std::max(stages, static_cast<int>(r.stages.size()));
  const auto& r0 = replicas.front();
  out << "bubble: " << format("%.1f%%", 100.0 * bubble_fraction)
      << " of the pipeline phase idle (even stages would idle "
      << format("%.1f%%", 100.0 * scheduler::theoretical_bubble(
                                    schedule, stages, r0.micro_batches))
      << ")\n";
  int recomputing = 0, full = 0, blocks = 0;
  for (const auto& r : replicas)
    for (const auto& s : r.stages) {
      recomputing += s.recompute.any() ? 1 : 0;
      full += s.recompute.full ? 1 : 0;
      blocks += !s.recompute.full && s.recompute.blocks > 0 ? 1 : 0;
    }
  out << "shape: " << replicas.size() << " replica"
      << (replicas.size() == 1 ? "" : "s");
  if (!shape.empty())
    out << " " << shape;
  out << ", " << to_string(schedule) << ", " << r0.micro_batches << " x "
      << r0.micro_batch_size << " sequences";
  if (replicas.size() > 1)
    out << " in replica 0";
  out << ", " << recomputing << " stage" << (recomputing == 1 ? "" : "s")
      << " recomputing";
  if (recomputing > 0)
    out << " (" << full << " whole, " << blocks << " whole blocks, "
        << recomputing - full - blocks << " attention only)";
  if (zero1)
    out << ", AdamW moments sharded over the " << replicas.size()
        << " replicas (ZeRO-1)";
  out << "; step " << seconds_text(step_seconds) << " = pipeline "
      << seconds_text(pipeline_seconds);
  if (allreduce_seconds > 0)
    out << " (all-reduces of up to " << seconds_text(allreduce_seconds)
        << " inside)";
  out << (zero1 ? " + optimizer and parameter all-gather " : " + optimizer ")
      << seconds_text(optimizer_seconds) << "\n";
  if (idle_chips > 0)
    out << "idle: " << idle_reason
        << (all_chips_step_seconds > 0
              ? format(" (%.3fx this plan's)",
                       all_chips_step_seconds / step_seconds)
              : "")
        << "\n";
  if (!zero1_reason.empty())
    out << "ZeRO-1: " << zero1_reason << "\n";
  if (candidates > 0)
    out << "search: " << candidates << " layouts, " << simulations
        << " simulations, " << measurements << " measurements; "
        << (proven_optimal ? "proven optimal for the simulator"
                           : "best found (not proven optimal)")
        << "\n";
  return out.str();
}

std::string plan_report::summary() const {
  return "predicted step " + seconds_text(step_seconds) + ", " +
         format("%.0f", tokens_per_second) + " tokens/s, bubble " +
         format("%.1f%%", 100.0 * bubble_fraction);
}

std::string suggested_change::describe() const {
  switch (what) {
    case kind::enable_recompute:
      return "enable recomputation";
    case kind::halve_micro_batch:
      return "halve the micro-batch";
    case kind::add_chips:
      return "add " + std::to_string(count) + " chip" +
             (count == 1 ? "" : "s") + " of " + device;
  }
  return "?";
}

infeasible_error::infeasible_error(std::string problem,
                                   std::optional<suggested_change> change)
    : config_error("plan",
                   "no plan fits: " + problem +
                     (change
                        ? "; suggested change: " + change->describe() +
                            " (checked: then a plan fits, " +
                            seconds_text(change->step_seconds) + " per step)"
                        : "; no single change (recomputation, a smaller "
                          "micro-batch, more chips of one kind) makes it fit")),
      problem_(std::move(problem)),
      change_(std::move(change)) {
}

planner::planner(const job_config& job, chip_measurements& measurements,
                 planner_options options)
    : impl_(std::make_unique<impl>(job, measurements, std::move(options))) {
}

planner::~planner() = default;

const std::vector<const chip_spec*>& planner::chips() const noexcept {
  return impl_->chips;
}
const planner_options& planner::options() const noexcept {
  return impl_->options;
}
schedule_kind planner::schedule() const noexcept {
  return impl_->pipeline_schedule;
}
cost_model& planner::costs() noexcept {
  return impl_->costs;
}
std::size_t planner::simulations() const noexcept {
  return impl_->simulations + impl_->pipeline_simulator.runs();
}

std::vector<pipeline_candidate> planner::stage_one() {
  return impl_->stage_one();
}

stage_two_result planner::stage_two(const pipeline_candidate& c, double bound) {
  return impl_->stage_two(c, bound);
}

simulation planner::simulate(const plan& p, bool timeline) {
  return impl_->simulate_plan(p, timeline);
}

plan_report planner::evaluate(const plan& p, bool timeline) {
  return impl_->report_of(p, impl_->simulate_plan(p, timeline));
}

namespace {

/// What does not fit where, for a job without any feasible plan: the
/// model's state against all memory, the largest layer against the largest
/// chip, or the pipeline of every chip (most memory first) at the smallest
/// micro-batch.
std::string diagnose(planner::impl& im) {
  const auto& cfg = im.job->model;
  double total_static = 0;
  for (int l = 0; l < cfg.num_layers(); ++l)
    total_static += 16.0 * static_cast<double>(layer_parameters(cfg, l));
  double total_capacity = 0;
  for (auto* c : im.chips)
    total_capacity += im.costs.capacity_bytes(*c);
  std::ostringstream out;
  if (total_static > total_capacity) {
    out << "the model's weights, gradients and AdamW moments ("
        << bytes_text(total_static) << ", 16 bytes x " << model_parameters(cfg)
        << " parameters) exceed the memory of all " << im.chips.size()
        << " chips together (" << bytes_text(total_capacity) << ")";
    return out.str();
  }
  // The chips by memory, most first: the pipeline that holds the most.
  std::vector<const chip_spec*> order = im.chips;
  std::stable_sort(order.begin(), order.end(), [&](auto* a, auto* b) {
    return im.costs.capacity_bytes(*a) > im.costs.capacity_bytes(*b);
  });
  const int mu = im.micro_batch_sizes(im.sequences()).empty()
                   ? 1
                   : im.micro_batch_sizes(im.sequences()).front();
  const recompute_levels levels = im.options.recompute;
  const bool rc = levels != recompute_levels::none;
  const int L = cfg.num_layers();
  const int p = std::min<int>(static_cast<int>(order.size()), L);
  const int m = im.sequences() / mu;
  // Greedy: every stage takes as many layers as fit.
  int next = 0;
  for (int s = 0; s < p && next < L; ++s) {
    const chip_spec& chip = *order[static_cast<std::size_t>(s)];
    const double cap = im.costs.capacity_bytes(chip);
    const int inflight = in_flight_bound(im.pipeline_schedule, p, s, m);
    // The last stage must end with the head.
    int lo = s + 1 == p ? L : next + 1;
    int best = -1;
    for (int end = lo; end <= L; ++end) {
      if (!im.costs.coefficients(chip, mu).fitting(
            stage_layers::of(cfg, next, end), inflight, cap, levels))
        break;
      best = end;
      if (s + 1 == p)
        break;
    }
    if (best < 0) {
      stage_cost c =
        im.costs.stage(chip, next, s + 1 == p ? L : next + 1, mu,
                       rc ? recompute_policy::whole() : recompute_policy{});
      out << "with every chip in one pipeline (most memory first), "
          << "micro-batches of " << mu << " sequence" << (mu == 1 ? "" : "s")
          << (rc ? " and recomputation" : "") << ", stage " << s << " on chip "
          << chip_text(chip) << " cannot hold layer"
          << (s + 1 == p && L - next > 1 ? "s [" : " [") << next << ", "
          << (s + 1 == p ? L : next + 1) << "): it needs "
          << bytes_text(c.peak_bytes(inflight)) << " ("
          << bytes_text(c.static_bytes) << " weights and optimizer state, "
          << inflight << " x " << bytes_text(c.held_bytes) << " in flight, "
          << bytes_text(c.working_bytes) << " working) of its "
          << bytes_text(cap);
      return out.str();
    }
    next = best;
  }
  out << "with every chip in one pipeline (most memory first), micro-batches "
      << "of " << mu << " sequence" << (mu == 1 ? "" : "s")
      << (rc ? " and recomputation" : "") << ", the stages hold only layers "
      << "[0, " << next << ") of " << L;
  return out.str();
}

/// Plans with `change` applied; the step time when a plan fits.
std::optional<double> check_change(const job_config& job,
                                   const planner_options& options,
                                   chip_measurements& m,
                                   const suggested_change& change) {
  job_config changed = job;
  planner_options opt = options;
  apply_change(change, changed, opt);
  opt.suggest_changes = false;
  try {
    planner pl(changed, m, opt);
    return pl.run().report.step_seconds;
  } catch (const infeasible_error&) {
    return std::nullopt;
  }
}

std::optional<suggested_change> find_change(planner::impl& im,
                                            chip_measurements& m) {
  const auto& opt = im.options;
  if (opt.recompute != recompute_levels::selective) {
    suggested_change c{suggested_change::kind::enable_recompute, "",
                       dtype::fp32, 0, 0};
    if (auto t = check_change(*im.job, opt, m, c)) {
      c.step_seconds = *t;
      return c;
    }
  }
  if (!opt.micro_batch_sizes.empty() &&
      *std::min_element(opt.micro_batch_sizes.begin(),
                        opt.micro_batch_sizes.end()) > 1) {
    suggested_change c{suggested_change::kind::halve_micro_batch, "",
                       dtype::fp32, 0, 0};
    if (auto t = check_change(*im.job, opt, m, c)) {
      c.step_seconds = *t;
      return c;
    }
  }
  // More chips of one kind present: the fewest that fit, most memory first
  // among equals.
  std::vector<int> classes(im.class_name.size());
  std::iota(classes.begin(), classes.end(), 0);
  std::stable_sort(classes.begin(), classes.end(), [&](int a, int b) {
    return im.class_capacity_bytes[static_cast<std::size_t>(a)] >
           im.class_capacity_bytes[static_cast<std::size_t>(b)];
  });
  std::optional<suggested_change> best;
  const int limit = std::max(64, 4 * static_cast<int>(im.chips.size()));
  for (int k : classes) {
    const chip_spec& like = *im.chips[static_cast<std::size_t>(
      im.class_members[static_cast<std::size_t>(k)].front())];
    suggested_change c{suggested_change::kind::add_chips, like.device,
                       like.compute_dtype, 0, 0};
    auto fits = [&](int count) {
      c.count = count;
      return check_change(*im.job, opt, m, c);
    };
    // Doubling, then bisection (more chips never make a job infeasible);
    // only counts below the best kind's so far are worth trying.
    const int cap = best ? best->count - 1 : limit;
    int lo = 0, hi = 1;
    std::optional<double> t_hi;
    while (hi <= cap) {
      if ((t_hi = fits(hi)))
        break;
      lo = hi;
      if (hi == cap)
        break;
      hi = std::min(2 * hi, cap);
    }
    if (!t_hi)
      continue;
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      if (auto t = fits(mid)) {
        hi = mid;
        t_hi = t;
      } else {
        lo = mid;
      }
    }
    c.count = hi;
    c.step_seconds = *t_hi;
    best = c;
  }
  return best;
}

} // namespace

planned planner::run() {
  auto& im = *impl_;
  auto candidates = im.stage_one();
  stage_two_result best;
  std::string best_shape;
  bool proven = true;
  std::vector<candidate_outcome> ranking;
  const double inf = std::numeric_limits<double>::infinity();
  for (const auto& c : candidates) {
    auto r =
      im.stage_two(c, im.options.rank_candidates ? inf : best.step_seconds);
    if (im.options.rank_candidates)
      ranking.push_back(
        {c.description, r.feasible, r.step_seconds, r.proven_optimal});
    proven = proven && r.proven_optimal;
    if (r.feasible && r.step_seconds < best.step_seconds) {
      best = std::move(r);
      best_shape = c.description;
    }
  }
  if (!best.feasible) {
    std::string problem = diagnose(im);
    std::optional<suggested_change> change;
    if (im.options.suggest_changes)
      change = find_change(im, im.costs.measurements().source());
    throw infeasible_error(problem, change);
  }
  planned out;
  out.value = best.value;
  out.report = evaluate(best.value);
  out.report.candidates = candidates.size();
  out.report.simulations = simulations();
  out.report.proven_optimal = proven;
  out.report.shape = best_shape;
  explain_idle_chips(im, candidates, best, out.report);
  std::stable_sort(ranking.begin(), ranking.end(), [](auto& a, auto& b) {
    return a.feasible && (!b.feasible || a.step_seconds < b.step_seconds);
  });
  out.report.ranking = std::move(ranking);
  return out;
}

void apply_change(const suggested_change& change, job_config& job,
                  planner_options& options) {
  switch (change.what) {
    case suggested_change::kind::enable_recompute:
      options.recompute = recompute_levels::selective;
      return;
    case suggested_change::kind::halve_micro_batch:
      for (int& mu : options.micro_batch_sizes)
        mu = std::max(1, mu / 2);
      return;
    case suggested_change::kind::add_chips: {
      const chip_spec* like = nullptr;
      for (const auto* c : job.chips())
        if (c->device == change.device &&
            c->compute_dtype == change.compute_dtype)
          like = c;
      if (like == nullptr)
        throw config_error("nodes", "no chip of " + change.device +
                                      " to copy for the suggested change");
      chip_spec proto = *like;
      int left = change.count;
      const bool listed =
        job.plan.mode == plan_mode::automatic || !options.chips.empty();
      while (left > 0) {
        node_spec node;
        node.rank = static_cast<int>(job.nodes.size());
        for (int i = 0; i < std::min(left, 8); ++i) {
          chip_spec c = proto;
          c.id = chip_id{node.rank, i};
          node.chips.push_back(c);
          if (listed)
            (options.chips.empty() ? job.plan.stages : options.chips)
              .push_back(c.id);
        }
        left -= static_cast<int>(node.chips.size());
        job.nodes.push_back(std::move(node));
      }
      return;
    }
  }
}

plan_report evaluate_plan(const job_config& job, const plan& p,
                          chip_measurements& measurements, bool timeline) {
  planner pl(job, measurements);
  return pl.evaluate(p, timeline);
}

} // namespace h2::scheduler
