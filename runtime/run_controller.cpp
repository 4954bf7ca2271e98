#include "h2/runtime/run_controller.hpp"

#include "h2/scheduler/plan_builder.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <utility>

namespace h2::runtime {

using nlohmann::json;

std::string_view to_string(run_phase p) noexcept {
  switch (p) {
    case run_phase::running:
      return "running";
    case run_phase::paused:
      return "paused";
    case run_phase::saving:
      return "saving";
    case run_phase::rebalancing:
      return "rebalancing";
    case run_phase::stopping:
      return "stopping";
  }
  return "?";
}

plan_change plan_change::of(const scheduler::rebalance_proposal& p) {
  return {p.value, p.reason, p.before_seconds, p.after_seconds};
}

run_controller::run_controller(options o)
    : job_(std::move(o.job)),
      step_(o.first_step),
      steps_(o.steps),
      replans_(std::move(o.replans)),
      stop_(o.stop ? std::move(o.stop) : std::make_shared<std::atomic<int>>(0)),
      checkpoints_(o.checkpoints) {
  if (o.rebalancing)
    rebalancer_ = std::make_unique<rebalancer>(job_, o.start);
}

run_phase run_controller::phase() const noexcept {
  if (finishing_ || stop_requested())
    return run_phase::stopping;
  if (rebalancing_)
    return run_phase::rebalancing;
  if (held_)
    return run_phase::paused;
  if (saving_)
    return run_phase::saving;
  return run_phase::running;
}

bool run_controller::stop_requested() const noexcept {
  return stop_->load() != 0;
}

boundary_action run_controller::at_boundary() {
  boundary_action a;
  if (step_ >= steps_ || stop_requested()) {
    finishing_ = true;
    held_ = false;
    a.what = boundary_action::kind::finish;
    a.stopped_early = step_ < steps_;
    return a;
  }
  if (std::exchange(checkpoint_requested_, false) && checkpoints_) {
    a.what = boundary_action::kind::checkpoint;
    return a;
  }
  const auto& drills = job_->drills;
  for (; next_drill_ < drills.size() && drills[next_drill_].step <= step_;
       ++next_drill_)
    if (drills[next_drill_].step == step_) // a resumed run starts past some
      due_drills_.push_back(drills[next_drill_]);
  if (!due_drills_.empty()) {
    a.what = boundary_action::kind::drills;
    a.drills = std::exchange(due_drills_, {});
    return a;
  }
  if (auto forced = replans_.extract(step_)) {
    pending_.reset(); // a forced re-plan replaces what the policy wanted
    a.what = boundary_action::kind::replan;
    a.change = plan_change{std::move(forced.mapped()), "--replan", 0, 0};
    return a;
  }
  if (pending_) {
    a.what = boundary_action::kind::replan;
    a.change = std::exchange(pending_, std::nullopt);
    return a;
  }
  if (pause_requested_) {
    held_ = true;
    a.what = boundary_action::kind::hold;
    return a;
  }
  return a;
}

bool run_controller::step_ended(
  double step_seconds, const std::vector<chip_step_report>& steps,
  const std::vector<chip_update_report>& updates) {
  last_step_seconds_ = step_seconds;
  if (rebalancer_)
    if (auto proposal =
          rebalancer_->policy().observe(observations_of(step_, steps, updates)))
      pending_ = plan_change::of(*proposal);
  ++step_;
  const int every = job_->checkpoint.every;
  return every > 0 && step_ % every == 0 && step_ < steps_;
}

int run_controller::replan_ended(const plan& now) {
  rebalancing_ = false;
  if (rebalancer_)
    rebalancer_->policy().adopt(now, step_);
  return ++generation_;
}

void run_controller::refuse_when_stopping(std::string_view command) const {
  if (phase() == run_phase::stopping)
    throw admin_error(std::string(command) +
                      ": the job is stopping at its next step boundary");
}

admin_outcome run_controller::execute(const admin_command& cmd,
                                      const plan& running) {
  switch (cmd.verb) {
    case admin_verb::status:
      return {status(running)};
    case admin_verb::plan:
      return {json{{"generation", generation_},
                   {"step", step_},
                   {"plan", json::parse(to_json(running, -1))}}
                .dump()};
    case admin_verb::rebalance:
      return rebalance(cmd, running);
    case admin_verb::policy:
      if (!rebalancer_)
        throw admin_error("policy: the job keeps no rebalancing policy");
      rebalancer_->policy().set_mode(cmd.mode);
      return {json{{"policy", to_string(cmd.mode)}}.dump()};
    case admin_verb::pause:
      refuse_when_stopping("pause");
      pause_requested_ = true;
      return {held_ ? json{{"paused", true}}.dump()
                    : json{{"paused", "at the next step boundary"}}.dump()};
    case admin_verb::resume:
      pause_requested_ = false;
      return {json{{"paused", false}}.dump(), std::exchange(held_, false)};
    case admin_verb::checkpoint:
      if (!checkpoints_)
        throw admin_error("checkpoint: the job has no [checkpoint] dir");
      if (phase() == run_phase::stopping) // the stop saves anyway
        return {json{{"checkpoint", "as the job stops"}}.dump()};
      checkpoint_requested_ = true; // a paused run saves now, still paused
      return {json{{"checkpoint", "at the next step boundary"}}.dump(),
              std::exchange(held_, false)};
    case admin_verb::throttle:
      return throttle(cmd, running);
    case admin_verb::stop: {
      int none = 0;
      stop_->compare_exchange_strong(none, 1);
      return {json{{"stopping", true}}.dump(), std::exchange(held_, false)};
    }
  }
  throw admin_error("unknown command");
}

admin_outcome run_controller::rebalance(const admin_command& cmd,
                                        const plan& running) {
  refuse_when_stopping("rebalance");
  if (cmd.best) {
    if (!rebalancer_)
      throw admin_error("rebalance: the job keeps no rebalancing policy");
    auto p = rebalancer_->policy().propose_now(step_, "admin");
    if (!p)
      throw admin_error("rebalance: no plan within the live limits is "
                        "predicted faster than the running one");
    json answer = {
      {"scheduled", true},
      {"predicted_step_seconds", {p->before_seconds, p->after_seconds}},
      {"moved_bytes", p->moved_bytes}};
    pending_ = plan_change::of(*p);
    return {answer.dump(), std::exchange(held_, false)};
  }
  plan p = plan_from_json(cmd.plan_json, "the admin's plan");
  scheduler::check_plan(p, *job_, "the admin's plan");
  if (plan_chips(p) == plan_chips(running)) {
    pending_ = plan_change{std::move(p), "admin plan", 0, 0};
    return {json{{"scheduled", true}}.dump(), std::exchange(held_, false)};
  }
  if (!cmd.restart)
    throw admin_error("rebalance: this plan changes the chips or their "
                      "order: a live rebalance cannot, a restart can "
                      "(rebalance --plan FILE --restart)");
  if (!checkpoints_)
    throw admin_error("rebalance: a restart resumes from a checkpoint: the "
                      "job has no [checkpoint] dir");
  int none = 0;
  stop_->compare_exchange_strong(none, 1); // the stop saves a checkpoint
  return {json{{"restart", true},
               {"message", "the job saves a checkpoint and stops at the "
                           "next step boundary; start it again with "
                           "--resume latest --plan FILE"}}
            .dump(),
          std::exchange(held_, false)};
}

admin_outcome run_controller::throttle(const admin_command& cmd,
                                       const plan& running) {
  refuse_when_stopping("throttle");
  const chip_spec* chip = job_->find_chip(cmd.chip);
  const auto ids = plan_chips(running);
  if (chip == nullptr ||
      std::find(ids.begin(), ids.end(), cmd.chip) == ids.end())
    throw admin_error("throttle: no chip " + cmd.chip.to_string() +
                      " in the running plan");
  if (chip->backend != device_backend::emulated)
    throw admin_error("throttle: chip " + cmd.chip.to_string() + " (" +
                      chip->device +
                      ") is not emulated: only emulated chips can be "
                      "throttled");
  due_drills_.push_back(drill{step_, cmd.chip, cmd.factor});
  return {
    json{{"throttle", cmd.chip.to_string()}, {"factor", cmd.factor}}.dump(),
    std::exchange(held_, false)};
}

std::string run_controller::status(const plan& running) const {
  run_status s;
  s.step = step_;
  s.steps = steps_;
  s.generation = generation_;
  s.phase = std::string(to_string(phase()));
  s.paused = held_;
  s.last_step_seconds = last_step_seconds_;
  s.throttles = throttles_;
  return status_json(*job_, running, s,
                     rebalancer_ ? &rebalancer_->policy() : nullptr);
}

} // namespace h2::runtime
