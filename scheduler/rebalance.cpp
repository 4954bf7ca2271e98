// Live rebalancing, the policy (docs/rebalance.md).
#include "h2/scheduler/rebalance.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "h2/scheduler/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace h2::scheduler {

namespace {

constexpr std::size_t kind_index(layer_kind k) noexcept {
  return static_cast<std::size_t>(k);
}

constexpr layer_kind all_kinds[] = {layer_kind::embedding, layer_kind::block,
                                    layer_kind::head};

/// A factor on the calibration grid (never 0).
double rounded(double factor) {
  return std::max(calibration_quantum,
                  std::round(factor / calibration_quantum) *
                    calibration_quantum);
}

/// A usable ratio sample: finite and non-negative over a positive base.
bool usable(double observed, double predicted) {
  return predicted > 0 && std::isfinite(observed) && observed >= 0 &&
         std::isfinite(predicted);
}

/// Where `chip` runs in `p`: its replica and the stages (chunks) it holds
/// there, in pipeline order; replica -1 when it runs none.
struct chip_place {
  int replica = -1;
  std::vector<int> stages;
};

chip_place place_of(const plan& p, const chip_id& chip) {
  chip_place out;
  for (std::size_t r = 0; r < p.replicas.size() && out.replica < 0; ++r) {
    const auto& stages = p.replicas[r].stages;
    for (std::size_t s = 0; s < stages.size(); ++s)
      if (stages[s].chip == chip) {
        out.replica = static_cast<int>(r);
        out.stages.push_back(static_cast<int>(s));
      }
  }
  return out;
}

std::vector<chip_id> chips_of(const replica_plan& r) {
  std::vector<chip_id> out;
  for (const auto& s : r.stages)
    out.push_back(s.chip);
  return out;
}

/// The current plan's prediction and the best plan within the live limits
/// (both from one planner, so they share its measurements).
struct within_result {
  plan_report current;
  std::optional<planned> best;
};

within_result search_within(const job_config& job_file, chip_measurements& m,
                            const plan& current, planner_options options) {
  options.chips = plan_chips(current);
  options.schedule = current.schedule;
  options.suggest_changes = false;
  // The running plan's ZeRO-1, whatever the job file says.
  job_config job = job_file;
  job.plan.zero1 = current.zero1;
  planner pl(job, m, options);
  bool chunks = false;
  for (const auto& r : current.replicas)
    chunks = chunks || r.stages.size() > replica_chips(r).size();
  if (chunks) {
    // Several chunks per chip: the layout stays, its boundaries move
    // (stage 2 plans one chunk per chip).
    within_result out;
    out.current = pl.evaluate(current);
    if (out.current.fits)
      out.best = improve_boundaries(pl, planned{current, out.current});
    return out;
  }
  const auto& chips = pl.chips();
  std::map<chip_id, int> index;
  for (std::size_t i = 0; i < chips.size(); ++i)
    index.emplace(chips[i]->id, static_cast<int>(i));

  // The candidate keeps every replica's chips in order; replicas whose
  // chips are alike stage by stage (kind and capacity) form one group of
  // identical replicas, as stage 1 would have grouped them.
  auto candidate_of = [&](bool group_alike) {
    pipeline_candidate c;
    std::vector<std::vector<std::pair<std::string, double>>> signatures;
    for (const auto& r : current.replicas) {
      std::vector<int> members;
      std::vector<std::pair<std::string, double>> signature;
      for (const auto& id : replica_chips(r)) {
        const int i = index.at(id);
        members.push_back(i);
        const chip_spec& chip = *chips[static_cast<std::size_t>(i)];
        signature.emplace_back(chip_kind_key(chip),
                               pl.costs().capacity_bytes(chip));
      }
      auto same = std::find(signatures.begin(), signatures.end(), signature);
      if (group_alike && same != signatures.end()) {
        c.groups[static_cast<std::size_t>(same - signatures.begin())]
          .replicas.push_back(std::move(members));
        continue;
      }
      signatures.push_back(std::move(signature));
      replica_group g;
      g.replicas.push_back(std::move(members));
      c.groups.push_back(std::move(g));
    }
    c.description = "the running chips";
    return c;
  };
  auto grouped = candidate_of(true);
  stage_two_result r = pl.stage_two(grouped);
  // A group of identical replicas splits the batch evenly; when it cannot,
  // each replica on its own may still take its share.
  if (!r.feasible && grouped.groups.size() < current.replicas.size())
    r = pl.stage_two(candidate_of(false));

  within_result out;
  out.current = pl.evaluate(current);
  if (r.feasible) {
    // Stage 2 lists replicas group by group: back to the current order.
    plan value = r.value;
    value.replicas.clear();
    for (const auto& cur : current.replicas) {
      const auto want = replica_chips(cur);
      auto it = std::find_if(
        r.value.replicas.begin(), r.value.replicas.end(),
        [&](const replica_plan& x) { return replica_chips(x) == want; });
      H2_ENFORCE(it != r.value.replicas.end(),
                 "stage 2 lost the replica of chip ", want.front().to_string());
      value.replicas.push_back(*it);
    }
    plan_report report = pl.evaluate(value);
    if (report.fits) {
      planned p;
      p.value = std::move(value);
      p.report = std::move(report);
      out.best = std::move(p);
    }
  }
  // Stage 2's heuristic (deep pipelines, several groups) may miss the
  // current plan; never propose anything slower.
  if (out.current.fits && (!out.best || out.current.step_seconds <=
                                          out.best->report.step_seconds)) {
    planned p;
    p.value = current;
    p.report = out.current;
    out.best = std::move(p);
  }
  return out;
}

} // namespace

// ---------------------------------------------------------------------------
// Smoothing

double ewma::add(double sample) noexcept {
  value_ = samples_ == 0 ? sample : value_ + weight_ * (sample - value_);
  ++samples_;
  return value_;
}

// ---------------------------------------------------------------------------
// Calibration

live_calibration::live_calibration(const job_config& job,
                                   chip_measurements& profiled,
                                   double smoothing)
    : job_(&job), costs_(job, profiled), smoothing_(smoothing) {
  H2_ENFORCE(smoothing > 0 && smoothing <= 1, "smoothing=", smoothing);
}

const live_calibration::chip_state*
live_calibration::find(const chip_id& chip) const {
  auto it = chips_.find(chip);
  return it == chips_.end() ? nullptr : &it->second;
}

live_calibration::chip_state& live_calibration::state(const chip_id& chip) {
  return chips_.try_emplace(chip, smoothing_).first->second;
}

void live_calibration::add_compute(chip_state& cs, const chip_spec& spec,
                                   const replica_plan& rep,
                                   const std::vector<const stage_plan*>& chunks,
                                   schedule_kind schedule,
                                   const std::vector<layer_timing>& seen) {
  const auto& cfg = job_->model;
  double obs_f[3] = {0, 0, 0}, obs_b[3] = {0, 0, 0};
  double pred_f[3] = {0, 0, 0}, pred_b[3] = {0, 0, 0};
  bool ok = true;
  std::size_t i = 0;
  for (const auto* st : chunks) {
    int blocks = 0; // of the chunk so far
    for (int l = st->first_layer; l < st->end_layer; ++l, ++i) {
      const layer_kind k = kind_of_layer(cfg, l);
      const auto t = profiled().layer(spec, k, rep.micro_batch_size);
      ok = ok && usable(seen[i].forward_seconds, 1) &&
           usable(seen[i].backward_seconds, 1);
      obs_f[kind_index(k)] += seen[i].forward_seconds;
      obs_b[kind_index(k)] += seen[i].backward_seconds;
      pred_f[kind_index(k)] += t.forward_seconds;
      // The runtime's backward of a recomputing stage runs the forward
      // again, in whole or its attention cores (docs/planner.md, "Cost
      // model"); a split backward is B + W.
      const auto part = recomputed_part_of(st->recompute, k, blocks);
      const double again = part == recomputed_part::forward ? t.forward_seconds
                           : part == recomputed_part::attention
                             ? t.attention_seconds
                             : 0.0;
      blocks += k == layer_kind::block ? 1 : 0;
      pred_b[kind_index(k)] +=
        (splits_backward(schedule) ? t.input_seconds + t.weight_seconds
                                   : t.backward_seconds) +
        again;
    }
  }
  if (!ok)
    return;
  double of = 0, ob = 0, pf = 0, pb = 0;
  for (std::size_t k = 0; k < 3; ++k) {
    if (pred_f[k] > 0)
      cs.forward[k].add(obs_f[k] / pred_f[k]);
    if (pred_b[k] > 0)
      cs.backward[k].add(obs_b[k] / pred_b[k]);
    of += obs_f[k];
    ob += obs_b[k];
    pf += pred_f[k];
    pb += pred_b[k];
  }
  if (pf > 0)
    cs.forward_all.add(of / pf);
  if (pb > 0)
    cs.backward_all.add(ob / pb);
  if (pf + pb > 0)
    cs.compute.add((of + ob) / (pf + pb));
}

void live_calibration::add(const plan& current,
                           const step_observations& observations) {
  ++steps_;
  for (const auto& o : observations.chips) {
    const auto place = place_of(current, o.chip);
    H2_ENFORCE(place.replica >= 0, "step ", observations.step, ": chip ",
               o.chip.to_string(), " runs no stage of the current plan");
    const auto& rep = current.replicas[static_cast<std::size_t>(place.replica)];
    std::vector<const stage_plan*> chunks;
    int layers = 0;
    for (int s : place.stages) {
      chunks.push_back(&rep.stages[static_cast<std::size_t>(s)]);
      layers += chunks.back()->num_layers();
    }
    const chip_spec* spec = job_->find_chip(o.chip);
    H2_ENFORCE(spec != nullptr, "no chip ", o.chip.to_string());
    chip_state& cs = state(o.chip);
    if (!o.layers.empty()) {
      H2_ENFORCE(static_cast<int>(o.layers.size()) == layers, "step ",
                 observations.step, ": chip ", o.chip.to_string(), " reports ",
                 o.layers.size(), " layers, its stages hold ", layers);
      add_compute(cs, *spec, rep, chunks, current.schedule, o.layers);
    }
    // Under ZeRO-1 the chip updates and holds its share of the moments.
    const int zero1 = current.shards_optimizer()
                        ? static_cast<int>(current.replicas.size())
                        : 1;
    if (o.optimizer_seconds > 0) {
      double predicted = 0;
      for (const auto* st : chunks)
        predicted += costs_
                       .stage(*spec, st->first_layer, st->end_layer,
                              rep.micro_batch_size, st->recompute)
                       .sharded(zero1)
                       .optimizer_seconds;
      if (usable(o.optimizer_seconds, predicted))
        cs.optimizer.add(o.optimizer_seconds / predicted);
    }
    if (o.peak_bytes > 0) {
      // The simulator's peak of the chip's chunks (simulator.hpp): their
      // static bytes, the in-flight activations of the heaviest chunk.
      const auto layout = layout_of(rep);
      const int position =
        layout.chunk_chip[static_cast<std::size_t>(place.stages.front())];
      const int in_flight =
        in_flight_bound(current.schedule, layout, position, rep.micro_batches);
      double static_bytes = 0, held = 0, working = 0, optimizer = 0;
      for (const auto* st : chunks) {
        const auto c = costs_
                         .stage(*spec, st->first_layer, st->end_layer,
                                rep.micro_batch_size, st->recompute)
                         .sharded(zero1);
        static_bytes += c.static_bytes;
        held = std::max(held, c.held_bytes);
        working = std::max(working, c.working_bytes);
        optimizer = std::max(optimizer, current.replicas.size() > 1
                                          ? std::max(c.optimizer_working_bytes,
                                                     c.reduction_working_bytes)
                                          : c.optimizer_working_bytes);
      }
      const double predicted =
        static_bytes + std::max(held * in_flight + working, optimizer);
      if (usable(o.peak_bytes, predicted)) {
        cs.memory.add(o.peak_bytes / predicted);
        cs.peak_bytes.add(o.peak_bytes);
      }
    }
    if (usable(o.idle_seconds, 1))
      cs.idle_seconds.add(o.idle_seconds);
  }
  for (const auto& l : observations.links) {
    if (!usable(l.seconds, 1) || l.seconds <= 0)
      continue;
    const chip_spec* from = job_->find_chip(l.from);
    const chip_spec* to = job_->find_chip(l.to);
    if (from == nullptr || to == nullptr)
      continue;
    // The micro-batch size of the replica in which they are neighbours.
    for (const auto& rep : current.replicas) {
      const auto ids = chips_of(rep);
      bool neighbours = false;
      for (std::size_t s = 1; s < ids.size(); ++s)
        neighbours = neighbours || (ids[s - 1] == l.from && ids[s] == l.to) ||
                     (ids[s - 1] == l.to && ids[s] == l.from);
      if (!neighbours)
        continue;
      const double predicted =
        costs_.boundary_seconds(*from, *to, rep.micro_batch_size);
      if (usable(l.seconds, predicted))
        links_.try_emplace(std::make_pair(l.from, l.to), smoothing_)
          .first->second.add(l.seconds / predicted);
      break;
    }
  }
}

double live_calibration::forward_factor(const chip_id& chip,
                                        layer_kind kind) const {
  const chip_state* cs = find(chip);
  if (cs == nullptr)
    return 1;
  if (!cs->forward[kind_index(kind)].empty())
    return rounded(cs->forward[kind_index(kind)].value());
  return cs->forward_all.empty() ? 1.0 : rounded(cs->forward_all.value());
}

double live_calibration::backward_factor(const chip_id& chip,
                                         layer_kind kind) const {
  const chip_state* cs = find(chip);
  if (cs == nullptr)
    return 1;
  if (!cs->backward[kind_index(kind)].empty())
    return rounded(cs->backward[kind_index(kind)].value());
  return cs->backward_all.empty() ? 1.0 : rounded(cs->backward_all.value());
}

double live_calibration::optimizer_factor(const chip_id& chip) const {
  const chip_state* cs = find(chip);
  return cs == nullptr || cs->optimizer.empty()
           ? 1.0
           : rounded(cs->optimizer.value());
}

double live_calibration::compute_factor(const chip_id& chip) const {
  const chip_state* cs = find(chip);
  return cs == nullptr || cs->compute.empty() ? 1.0 : cs->compute.value();
}

double live_calibration::memory_factor(const chip_id& chip) const {
  const chip_state* cs = find(chip);
  if (cs == nullptr || cs->memory.empty())
    return 1;
  // Rounded up: the planner must not count on memory the chip lacks.
  return std::max(1.0, std::ceil(cs->memory.value() / calibration_quantum) *
                         calibration_quantum);
}

double live_calibration::link_factor(const chip_id& from,
                                     const chip_id& to) const {
  auto it = links_.find({from, to});
  if (it == links_.end())
    it = links_.find({to, from});
  return it == links_.end() ? 1.0 : it->second.value();
}

double live_calibration::idle_seconds(const chip_id& chip) const {
  const chip_state* cs = find(chip);
  return cs == nullptr ? 0.0 : cs->idle_seconds.value();
}

double live_calibration::peak_bytes(const chip_id& chip) const {
  const chip_state* cs = find(chip);
  return cs == nullptr ? 0.0 : cs->peak_bytes.value();
}

layer_timing live_measurements::layer(const chip_spec& chip, layer_kind kind,
                                      int micro_batch_size) {
  const chip_spec* profiled = calibration_->job().find_chip(chip.id);
  H2_ENFORCE(profiled != nullptr, "no chip ", chip.id.to_string());
  // Asked under the chip's own profile: live_job() renamed it.
  layer_timing t =
    calibration_->profiled().layer(*profiled, kind, micro_batch_size);
  t.forward_seconds *= calibration_->forward_factor(chip.id, kind);
  const double backward = calibration_->backward_factor(chip.id, kind);
  t.backward_seconds *= backward;
  t.input_seconds *= backward;
  t.weight_seconds *= backward;
  return t;
}

double live_measurements::optimizer(const chip_spec& chip, layer_kind kind) {
  const chip_spec* profiled = calibration_->job().find_chip(chip.id);
  H2_ENFORCE(profiled != nullptr, "no chip ", chip.id.to_string());
  return calibration_->profiled().optimizer(*profiled, kind) *
         calibration_->optimizer_factor(chip.id);
}

job_config live_job(const live_calibration& calibration) {
  job_config live = calibration.job();
  for (auto& node : live.nodes)
    for (auto& chip : node.chips) {
      std::vector<double> factors;
      for (layer_kind k : all_kinds) {
        factors.push_back(calibration.forward_factor(chip.id, k));
        factors.push_back(calibration.backward_factor(chip.id, k));
      }
      factors.push_back(calibration.optimizer_factor(chip.id));
      const double memory = calibration.memory_factor(chip.id);
      factors.push_back(memory);
      if (std::all_of(factors.begin(), factors.end(),
                      [](double f) { return f == 1.0; }))
        continue;
      // The factors on their grid name the chip's live kind: chips of one
      // kind that run alike keep sharing measurements and a stage-2 group.
      std::string suffix = "~";
      for (std::size_t i = 0; i < factors.size(); ++i) {
        if (i > 0)
          suffix += '.';
        suffix +=
          std::to_string(std::llround(factors[i] / calibration_quantum));
      }
      chip.profile.name += suffix;
      if (memory > 1 && chip.profile.memory_bytes > 0)
        chip.profile.memory_bytes = static_cast<std::uint64_t>(
          std::floor(static_cast<double>(chip.profile.memory_bytes) / memory));
    }
  return live;
}

// ---------------------------------------------------------------------------
// The plans a live rebalance may reach, and what a move costs

std::optional<planned> best_plan_within(const job_config& job,
                                        chip_measurements& measurements,
                                        const plan& current,
                                        planner_options options) {
  return search_within(job, measurements, current, std::move(options)).best;
}

std::vector<layer_move> layer_moves(const job_config& job, const plan& from,
                                    const plan& to) {
  H2_ENFORCE(from.replicas.size() == to.replicas.size(), "replicas ",
             from.replicas.size(), " -> ", to.replicas.size());
  const auto& cfg = job.model;
  const int L = cfg.num_layers();
  std::vector<layer_move> out;
  for (std::size_t r = 0; r < from.replicas.size(); ++r) {
    const auto& a = from.replicas[r];
    const auto& b = to.replicas[r];
    H2_ENFORCE(chips_of(a) == chips_of(b), "replica ", r,
               " changes its chips: a live rebalance keeps them");
    auto owners = [&](const replica_plan& rp) {
      std::vector<chip_id> owner(static_cast<std::size_t>(L));
      for (const auto& st : rp.stages)
        for (int l = st.first_layer; l < st.end_layer; ++l)
          owner[static_cast<std::size_t>(l)] = st.chip;
      return owner;
    };
    const auto old_owner = owners(a), new_owner = owners(b);
    for (int l = 0; l < L; ++l) {
      const auto& x = old_owner[static_cast<std::size_t>(l)];
      const auto& y = new_owner[static_cast<std::size_t>(l)];
      if (x == y)
        continue;
      const double bytes = moved_bytes_per_parameter *
                           static_cast<double>(layer_parameters(cfg, l));
      if (!out.empty() && out.back().replica == static_cast<int>(r) &&
          out.back().end_layer == l && out.back().from == x &&
          out.back().to == y) {
        out.back().end_layer = l + 1;
        out.back().bytes += bytes;
        continue;
      }
      layer_move m;
      m.replica = static_cast<int>(r);
      m.first_layer = l;
      m.end_layer = l + 1;
      m.from = x;
      m.to = y;
      m.bytes = bytes;
      out.push_back(m);
    }
  }
  for (auto& m : out) {
    const chip_spec* x = job.find_chip(m.from);
    const chip_spec* y = job.find_chip(m.to);
    H2_ENFORCE(x != nullptr && y != nullptr, "no chip ", m.from.to_string(),
               " or ", m.to.to_string());
    m.seconds = resolve_link(job, *x, *y).seconds(m.bytes);
  }
  return out;
}

// ---------------------------------------------------------------------------
// The policy

rebalance_policy::rebalance_policy(const job_config& job,
                                   chip_measurements& profiled, plan current,
                                   rebalance_config config,
                                   planner_options options)
    : job_(&job),
      current_(std::move(current)),
      config_(config),
      options_(std::move(options)),
      calibration_(job, profiled,
                   config.smoothing > 0 && config.smoothing <= 1
                     ? config.smoothing
                     : 0.5) {
  check_rebalance_config(config_);
  validate_plan(current_, job, "plan");
  status_.policy = config_.policy;
}

std::optional<rebalance_proposal>
rebalance_policy::observe(const step_observations& obs) {
  calibration_.add(current_, obs);
  if (config_.policy == rebalance_mode::off) {
    status_.streak = 0;
    return std::nullopt;
  }
  // Every step of the window comes min_interval steps after the last
  // change: the new plan's own times have replaced the old ones by then.
  if (last_change_step_ >= 0 &&
      obs.step - last_change_step_ < config_.min_interval) {
    status_.streak = 0;
    return std::nullopt;
  }
  auto p = evaluate(obs.step);
  if (!p || !(p->net_gain > config_.threshold)) {
    status_.streak = 0;
    return std::nullopt;
  }
  if (++status_.streak < config_.window)
    return std::nullopt;
  status_.streak = 0;
  status_.last_proposal_step = obs.step;
  last_change_step_ = obs.step;
  p->reason = reason();
  return p;
}

std::optional<rebalance_proposal>
rebalance_policy::propose_now(int step, std::string why) {
  auto p = evaluate(step);
  if (!p || !(p->after_seconds < p->before_seconds))
    return std::nullopt;
  p->reason = std::move(why);
  status_.streak = 0;
  status_.last_proposal_step = step;
  last_change_step_ = step;
  return p;
}

void rebalance_policy::adopt(plan p, int step) {
  validate_plan(p, *job_, "rebalance");
  current_ = std::move(p);
  ++status_.generation;
  status_.streak = 0;
  last_change_step_ = step;
  reference_.clear();
  for (const auto& c : plan_chips(current_))
    reference_[c] = calibration_.compute_factor(c);
}

void rebalance_policy::set_mode(rebalance_mode mode) {
  config_.policy = mode;
  status_.policy = mode;
  status_.streak = 0;
}

std::optional<rebalance_proposal> rebalance_policy::evaluate(int step) {
  const job_config live = live_job(calibration_);
  // The live job's chips, as the planner tells them apart: the same key
  // and plan give the same search.
  std::string key;
  for (const auto* c : live.chips())
    key += c->id.to_string() + "=" + c->profile.name + "/" +
           std::to_string(c->profile.memory_bytes) + ";";
  if (key != searched_key_ || status_.generation != searched_generation_) {
    live_measurements measurements(calibration_);
    auto within = search_within(live, measurements, current_, options_);
    searched_key_ = std::move(key);
    searched_generation_ = status_.generation;
    searched_before_seconds_ = within.current.step_seconds;
    searched_best_ = std::move(within.best);
  }
  status_.evaluated_step = step;
  status_.before_seconds = searched_before_seconds_;
  status_.after_seconds = searched_before_seconds_;
  status_.gain = 0;
  status_.net_gain = 0;
  if (!searched_best_ || searched_best_->value == current_)
    return std::nullopt;
  rebalance_proposal p;
  p.step = step;
  p.value = searched_best_->value;
  p.moves = layer_moves(*job_, current_, p.value);
  for (auto& m : p.moves) {
    // Observed boundary transfers tell how the link really performs.
    m.seconds *= calibration_.link_factor(m.from, m.to);
    p.moved_bytes += m.bytes;
    p.move_seconds += m.seconds;
  }
  p.before_seconds = searched_before_seconds_;
  p.after_seconds = searched_best_->report.step_seconds;
  if (p.before_seconds > 0) {
    p.gain = (p.before_seconds - p.after_seconds) / p.before_seconds;
    const double amortised =
      p.move_seconds / static_cast<double>(std::max(1, config_.min_interval));
    p.net_gain = p.gain - amortised / p.before_seconds;
  }
  p.report = searched_best_->report;
  status_.after_seconds = p.after_seconds;
  status_.gain = p.gain;
  status_.net_gain = p.net_gain;
  return p;
}

std::string rebalance_policy::reason() const {
  // The chip whose speed changed most since the current plan was adopted.
  double slowest = 1, fastest = 1;
  chip_id slow_chip, fast_chip;
  for (const auto& c : plan_chips(current_)) {
    auto it = reference_.find(c);
    const double ref = it == reference_.end() ? 1.0 : it->second;
    const double ratio = calibration_.compute_factor(c) / ref;
    if (ratio > slowest) {
      slowest = ratio;
      slow_chip = c;
    }
    if (ratio < fastest) {
      fastest = ratio;
      fast_chip = c;
    }
  }
  constexpr double notable = 1.25;
  if (slowest >= notable && slowest * fastest >= 1)
    return "throttled chip " + slow_chip.to_string();
  if (fastest <= 1 / notable)
    return "recovered chip " + fast_chip.to_string();
  return "live metrics";
}

} // namespace h2::scheduler
