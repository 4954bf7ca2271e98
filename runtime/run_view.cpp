#include "h2/runtime/run_view.hpp"

#include "h2/scheduler/planner.hpp"
#include "h2/scheduler/timeline_svg.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>

namespace h2::runtime {

namespace {

/// The interval a recorded op draws as; nullopt for waits.
std::optional<scheduler::interval_kind> drawn_as(recorded_op op) {
  using scheduler::interval_kind;
  switch (op) {
    case recorded_op::forward:
      return interval_kind::forward;
    case recorded_op::backward:
      return interval_kind::backward;
    case recorded_op::backward_input:
      return interval_kind::backward_input;
    case recorded_op::backward_weight:
      return interval_kind::backward_weight;
    case recorded_op::allreduce:
      return interval_kind::allreduce;
    case recorded_op::optimizer:
      return interval_kind::optimizer;
    case recorded_op::recv_forward:
    case recorded_op::recv_backward:
      return std::nullopt;
  }
  return std::nullopt;
}

nlohmann::json memory_json(const memory_report& m) {
  return {{"used_bytes", m.used},
          {"peak_bytes", m.peak},
          {"capacity_bytes", m.capacity}};
}

} // namespace

scheduler::simulation measured_timeline(const step_summary& s) {
  scheduler::simulation sim;
  std::map<chip_id, std::pair<int, int>> row_of; // chip -> (replica, stage)
  for (const auto& c : s.chips) {
    if (c.replica < 0 || c.stage < 0)
      continue;
    const auto r = static_cast<std::size_t>(c.replica);
    if (sim.replicas.size() <= r)
      sim.replicas.resize(r + 1);
    auto& stages = sim.replicas[r];
    if (stages.size() <= static_cast<std::size_t>(c.stage))
      stages.resize(static_cast<std::size_t>(c.stage) + 1);
    row_of[c.chip] = {c.replica, c.stage};
  }
  double begin = std::numeric_limits<double>::infinity(), end = begin;
  end = -end;
  for (const auto& t : s.ops) {
    if (!row_of.contains(t.chip))
      continue;
    begin = std::min(begin, t.op.start);
    end = std::max(end, t.op.end);
  }
  if (!(end > begin))
    return sim;
  sim.step_seconds = end - begin;
  for (const auto& t : s.ops) {
    auto row = row_of.find(t.chip);
    auto kind = drawn_as(t.op.kind);
    if (row == row_of.end() || !kind)
      continue;
    const bool per_step = *kind == scheduler::interval_kind::allreduce ||
                          *kind == scheduler::interval_kind::optimizer;
    sim.timeline.push_back({row->second.first, row->second.second, *kind,
                            per_step ? -1 : t.op.micro_batch,
                            per_step ? -1 : t.op.chunk, t.op.start - begin,
                            t.op.end - begin});
  }
  return sim;
}

run_view::run_view(const job_config& job, int total_steps)
    : job_(job), total_steps_(total_steps) {
}

std::string run_view::row_label(const chip_id& chip) const {
  const chip_spec* c = job_.find_chip(chip);
  return chip.to_string() + " " + (c != nullptr ? c->profile.name : "?");
}

void run_view::add_event(int step, std::string kind, std::string text) {
  events_.push_back({step, std::move(kind), std::move(text)});
  while (events_.size() > max_events)
    events_.pop_front();
}

void run_view::on_setup(const plan& p, const std::vector<setup_report>& chips) {
  std::lock_guard lock(mutex_);
  const bool first = !plan_;
  plan_ = p;
  for (const auto& c : chips)
    setup_memory_[c.chip] = c.memory;
  if (first) {
    status_ = "training";
    add_event(0, "plan",
              std::to_string(chips.size()) + " chips, " +
                std::string(to_string(p.schedule)) + " schedule");
  }
}

void run_view::on_step(const step_summary& s) {
  auto copy = std::make_shared<const step_summary>(s); // outside the lock
  std::lock_guard lock(mutex_);
  last_ = std::move(copy);
  steps_done_ = s.step + 1;
  if (first_step_ < 0)
    first_step_ = s.step;
  if ((s.step - first_step_) % static_cast<int>(stride_) != 0)
    return;
  steps_.push_back(s.step + 1);
  losses_.push_back(s.loss);
  tokens_per_second_.push_back(s.tokens_per_second);
  if (steps_.size() < max_points)
    return;
  // Keep every other point: the series stays within max_points and evenly
  // spaced, whatever the run's length.
  auto thin = [](auto& v) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < v.size(); i += 2)
      v[kept++] = v[i];
    v.resize(kept);
  };
  thin(steps_);
  thin(losses_);
  thin(tokens_per_second_);
  stride_ *= 2;
}

void run_view::on_eval(int step, double val_loss) {
  char text[64];
  std::snprintf(text, sizeof text, "validation loss %.4f", val_loss);
  std::lock_guard lock(mutex_);
  add_event(step + 1, "eval", text);
}

void run_view::on_checkpoint(int steps, double waited_seconds,
                             double stall_seconds) {
  char text[96];
  std::snprintf(text, sizeof text,
                "checkpoint saved, training stalled %.3f s (%.3f s waiting)",
                stall_seconds, waited_seconds);
  std::lock_guard lock(mutex_);
  add_event(steps, "checkpoint", text);
}

void run_view::on_rebalance(const rebalance_event& e) {
  std::string moves;
  for (const auto& m : e.moves)
    moves += (moves.empty() ? "" : ", ") + m;
  char tail[96];
  std::snprintf(tail, sizeof tail, " | %s moved, paused %.3f s",
                scheduler::bytes_text(e.moved_bytes).c_str(), e.pause_seconds);
  std::lock_guard lock(mutex_);
  plan_ = e.value;
  generation_ = e.generation;
  add_event(e.step, "rebalance",
            "plan " + std::to_string(e.generation) + ": " + e.reason + " | " +
              (moves.empty() ? "no layers moved" : moves) + tail);
}

void run_view::finish(const run_summary& s) {
  std::lock_guard lock(mutex_);
  status_ = s.stopped_early ? "stopped" : "done";
  add_event(s.steps, "end",
            std::string(s.stopped_early ? "stopped" : "done") + " after " +
              std::to_string(s.steps) + " steps");
}

std::string run_view::state_json() const {
  std::lock_guard lock(mutex_);
  nlohmann::json j = {
    {"job", job_.name},
    {"model", std::to_string(model_parameters(job_.model)) + "-parameter " +
                std::string(display_name(job_.model.family)) + ", " +
                std::to_string(job_.model.num_layers()) + " layers"},
    {"clock", to_string(job_.emulation.clock)},
    {"status", status_},
    {"steps_done", steps_done_},
    {"total_steps", total_steps_},
    {"generation", generation_},
    {"timeline_step", last_ && !last_->ops.empty() ? last_->step + 1 : 0}};
  auto& replicas = j["plan"] = nlohmann::json::array();
  if (plan_) {
    j["schedule"] = to_string(plan_->schedule);
    for (const auto& r : plan_->replicas) {
      nlohmann::json stages = nlohmann::json::array();
      const auto positions = stage_positions(r);
      for (std::size_t s = 0; s < r.stages.size(); ++s) {
        const auto& st = r.stages[s];
        const chip_spec* c = job_.find_chip(st.chip);
        stages.push_back({{"chip", st.chip.to_string()},
                          {"profile", c != nullptr ? c->profile.name : "?"},
                          {"vendor", c != nullptr ? c->profile.vendor : "?"},
                          {"position", positions[s]},
                          {"first_layer", st.first_layer},
                          {"end_layer", st.end_layer},
                          {"recompute", to_string(st.recompute)}});
      }
      replicas.push_back({{"micro_batches", r.micro_batches},
                          {"micro_batch_size", r.micro_batch_size},
                          {"stages", std::move(stages)}});
    }
  }
  auto& chips = j["chips"] = nlohmann::json::array();
  if (last_) {
    j["last"] = {{"step", last_->step + 1},
                 {"loss", last_->loss},
                 {"tokens_per_second", last_->tokens_per_second},
                 {"step_seconds", last_->step_seconds},
                 {"bubble_fraction", last_->bubble_fraction}};
    for (const auto& c : last_->chips) {
      const double busy =
        c.forward_seconds + c.backward_seconds + c.optimizer_seconds;
      chips.push_back(
        {{"chip", c.chip.to_string()},
         {"label", row_label(c.chip)},
         {"replica", c.replica},
         {"stage", c.stage},
         {"utilisation", last_->step_seconds > 0
                           ? std::clamp(busy / last_->step_seconds, 0.0, 1.0)
                           : 0.0},
         {"bubble",
          last_->pipeline_seconds > 0
            ? std::clamp(c.idle_seconds / last_->pipeline_seconds, 0.0, 1.0)
            : 0.0},
         {"memory", memory_json(c.memory)}});
    }
  } else {
    for (const auto& [chip, memory] : setup_memory_)
      chips.push_back({{"chip", chip.to_string()},
                       {"label", row_label(chip)},
                       {"memory", memory_json(memory)}});
  }
  j["history"] = {{"step", steps_},
                  {"loss", losses_},
                  {"tokens_per_second", tokens_per_second_}};
  auto& events = j["events"] = nlohmann::json::array();
  for (const auto& e : events_)
    events.push_back({{"step", e.step}, {"kind", e.kind}, {"text", e.text}});
  // Job names and reasons come from users: replace bytes that are not
  // UTF-8 rather than fail.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<std::string> run_view::timeline_svg() const {
  std::shared_ptr<const step_summary> last;
  {
    std::lock_guard lock(mutex_);
    if (svg_ && svg_->from == last_)
      return svg_->svg;
    last = last_;
  }
  if (!last || last->ops.empty())
    return std::nullopt;
  const int step = last->step + 1;
  const auto sim = measured_timeline(*last);
  std::vector<std::vector<std::string>> labels(sim.replicas.size());
  for (std::size_t r = 0; r < sim.replicas.size(); ++r)
    labels[r].assign(sim.replicas[r].size(), "?");
  for (const auto& c : last->chips)
    if (c.replica >= 0 && c.stage >= 0)
      labels[static_cast<std::size_t>(c.replica)]
            [static_cast<std::size_t>(c.stage)] = row_label(c.chip);
  auto drawn = std::make_shared<const drawing>(drawing{
    last, scheduler::render_svg(
            sim, labels,
            "step " + std::to_string(step) + " as measured (" +
              std::string(to_string(job_.emulation.clock)) + " clock)")});
  std::lock_guard lock(mutex_);
  svg_ = drawn;
  return drawn->svg;
}

} // namespace h2::runtime
