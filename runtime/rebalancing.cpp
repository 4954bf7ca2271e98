#include "h2/runtime/rebalancing.hpp"

#include <nlohmann/json.hpp>

namespace h2::runtime {

scheduler::step_observations
observations_of(int step, const std::vector<chip_step_report>& steps,
                const std::vector<chip_update_report>& updates) {
  scheduler::step_observations out;
  out.step = step;
  for (const auto& r : steps) {
    scheduler::chip_observation c;
    c.chip = r.chip;
    for (const auto& l : r.layers)
      c.layers.push_back({l.forward_seconds, l.backward_seconds});
    for (const auto& u : updates)
      if (u.chip == r.chip)
        c.optimizer_seconds = u.op.virtual_seconds;
    c.idle_seconds = r.idle_seconds;
    c.peak_bytes = static_cast<double>(r.memory.peak);
    out.chips.push_back(std::move(c));
    for (const auto& l : r.links)
      if (l.transfers > 0)
        out.links.push_back({l.from, r.chip, l.seconds / l.transfers});
  }
  return out;
}

rebalancer::rebalancer(std::shared_ptr<const job_config> job,
                       const plan& current)
    : job_(std::move(job)),
      measurements_(*job_),
      policy_(*job_, measurements_, current, job_->rebalance) {
}

std::string status_json(const job_config& job, const plan& running,
                        const run_status& status,
                        const scheduler::rebalance_policy* policy) {
  using nlohmann::json;
  json chips = json::array();
  for (std::size_t r = 0; r < running.replicas.size(); ++r) {
    const auto& rep = running.replicas[r];
    const auto positions = stage_positions(rep);
    for (std::size_t s = 0; s < rep.stages.size(); ++s) {
      const auto& st = rep.stages[s];
      const chip_spec* spec = job.find_chip(st.chip);
      auto throttle = status.throttles.find(st.chip);
      json c = {{"chip", st.chip.to_string()},
                {"device", spec != nullptr ? spec->device : "?"},
                {"replica", r},
                {"stage", positions[s]},
                {"chunk", s},
                {"layers", {st.first_layer, st.end_layer}},
                {"recompute", to_string(st.recompute)},
                {"throttle",
                 throttle == status.throttles.end() ? 1.0 : throttle->second}};
      if (policy != nullptr && policy->calibration().steps() > 0) {
        const auto& cal = policy->calibration();
        c["compute_factor"] = cal.compute_factor(st.chip);
        c["idle_seconds"] = cal.idle_seconds(st.chip);
        c["peak_bytes"] = cal.peak_bytes(st.chip);
      }
      chips.push_back(std::move(c));
    }
  }
  json out = {{"job", job.name},
              {"step", status.step},
              {"steps", status.steps},
              {"phase", status.phase},
              {"paused", status.paused},
              {"schedule", std::string(to_string(running.schedule))},
              {"last_step_seconds", status.last_step_seconds},
              {"plan_generation", status.generation},
              {"plan", json::parse(to_json(running, -1))},
              {"chips", std::move(chips)}};
  if (policy != nullptr) {
    const auto& p = policy->status();
    out["policy"] = {{"mode", to_string(p.policy)},
                     {"threshold", policy->config().threshold},
                     {"window", policy->config().window},
                     {"min_interval", policy->config().min_interval},
                     {"streak", p.streak},
                     {"last_proposal_step", p.last_proposal_step},
                     {"evaluated_step", p.evaluated_step},
                     {"predicted_step_seconds", p.before_seconds},
                     {"best_predicted_step_seconds", p.after_seconds},
                     {"gain", p.gain},
                     {"net_gain", p.net_gain}};
  }
  return out.dump();
}

} // namespace h2::runtime
