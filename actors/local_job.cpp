#include "h2/actors/local_job.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/actors/chip_actor.hpp"
#include "h2/actors/errors.hpp"
#include "h2/actors/scheduler_actor.hpp"
#include "h2/transport/inproc/channel.hpp"

#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

namespace h2::actors {

void configure_actor_system(caf::actor_system_config& cfg) {
  cfg.add_message_type<chip_id>("h2.chip_id");
  cfg.add_message_type<op_record>("h2.op_record");
  cfg.add_message_type<clock_pair>("h2.clock_pair");
  cfg.add_message_type<memory_report>("h2.memory_report");
  cfg.add_message_type<channel_traffic>("h2.channel_traffic");
  cfg.add_message_type<setup_report>("h2.setup_report");
  cfg.add_message_type<step_command>("h2.step_command");
  cfg.add_message_type<chip_step_report>("h2.chip_step_report");
  cfg.add_message_type<update_command>("h2.update_command");
  cfg.add_message_type<chip_update_report>("h2.chip_update_report");
  cfg.add_message_type<eval_command>("h2.eval_command");
  cfg.add_message_type<chip_eval_report>("h2.chip_eval_report");
  cfg.add_message_type<run_summary>("h2.run_summary");
  cfg.add_message_type<parameter_values>("h2.parameter_values");
  cfg.add_error_category(error_category, render_error);
  // Chips run on threads of their own (detached); CAF's scheduler threads
  // only carry the scheduler actor's light work. One is enough, and it must
  // not busy-poll the cores the chips compute on.
  cfg.set("scheduler.max-threads", 1);
  cfg.set("work-stealing.aggressive-poll-attempts", 1);
  cfg.set("work-stealing.moderate-poll-attempts", 1);
}

local_job::local_job(std::shared_ptr<const job_config> job, plan p)
    : job_(std::move(job)), plan_(std::move(p)) {
  if (plan_.replicas.size() != 1)
    throw config_error("plan.replicas",
                       std::to_string(plan_.replicas.size()) +
                         " replicas: this release trains one pipeline "
                         "replica (data-parallel replicas need DiComm's "
                         "collectives)");
}

local_job::~local_job() = default;

void local_job::abort() noexcept {
  cancel_->cancel();
  std::lock_guard<std::mutex> guard(mutex_);
  for (auto& ch : channels_)
    ch->close();
}

run_summary local_job::run(const run_options& opts, training_observer& observer,
                           std::shared_ptr<std::atomic<int>> stop) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  caf::actor_system system{cfg};
  auto origin = devices::chip_clock::wall_clock::now();

  auto ctx = std::make_shared<run_context>();
  ctx->job = job_;
  ctx->the_plan = plan_;
  ctx->observer = &observer;
  ctx->stop = std::move(stop);

  int first_sequence = 0;
  for (std::size_t ri = 0; ri < plan_.replicas.size(); ++ri) {
    const auto& r = plan_.replicas[ri];
    const int stages = static_cast<int>(r.stages.size());
    // links[s] joins stage s and s + 1.
    std::vector<std::pair<std::shared_ptr<transport::channel>,
                          std::shared_ptr<transport::channel>>>
      links;
    for (int s = 0; s + 1 < stages; ++s) {
      auto [a, b] = transport::inproc::make_pair();
      links.emplace_back(std::move(a), std::move(b));
      std::lock_guard<std::mutex> guard(mutex_);
      channels_.push_back(links.back().first);
      channels_.push_back(links.back().second);
    }
    for (int s = 0; s < stages; ++s) {
      const auto& sp = r.stages[static_cast<std::size_t>(s)];
      worker_setup w;
      w.job = job_;
      w.chip = job_->find_chip(sp.chip);
      H2_ENFORCE(w.chip != nullptr, "no chip ", sp.chip.to_string());
      w.replica = static_cast<int>(ri);
      w.stage = s;
      w.stages = stages;
      w.assignment = sp;
      w.micro_batch_size = r.micro_batch_size;
      w.micro_batches = r.micro_batches;
      w.first_sequence = first_sequence;
      w.schedule = plan_.schedule;
      w.origin = origin;
      w.cancel = cancel_;
      auto neighbour = [&](int n) {
        return job_->find_chip(r.stages[static_cast<std::size_t>(n)].chip);
      };
      if (s > 0) {
        w.prev = links[static_cast<std::size_t>(s - 1)].second;
        w.prev_chip = neighbour(s - 1)->id;
        w.prev_profile = neighbour(s - 1)->profile;
      }
      if (s + 1 < stages) {
        w.next = links[static_cast<std::size_t>(s)].first;
        w.next_chip = neighbour(s + 1)->id;
        w.next_profile = neighbour(s + 1)->profile;
      }
      ctx->chips.push_back(
        system.spawn<caf::detached>(chip_actor, std::move(w)));
    }
    first_sequence += r.sequences();
  }

  auto sched = spawn_scheduler(system, ctx);
  std::optional<run_summary> result;
  std::optional<failure> failed;
  {
    caf::scoped_actor self{system};
    self->request(sched, caf::infinite, train_atom::value, opts.steps)
      .receive([&](run_summary& s) { result = s; },
               [&](caf::error& e) { failed = to_failure(e); });
    parameters_.clear();
    if (!failed && opts.collect_parameters) {
      // Chips of replica 0 come first, in stage (and so layer) order.
      const auto stages = plan_.replicas.front().stages.size();
      for (std::size_t i = 0; i < stages && !failed; ++i)
        self->request(ctx->chips[i], caf::infinite, params_atom::value)
          .receive(
            [&](std::vector<parameter_values>& ps) {
              for (auto& p : ps)
                parameters_.push_back(std::move(p));
            },
            [&](caf::error& e) { failed = to_failure(e); });
    }
    for (auto& chip : ctx->chips)
      self->send_exit(chip, caf::exit_reason::user_shutdown);
    self->send_exit(sched, caf::exit_reason::user_shutdown);
  }
  // Chips still blocked in a wait end it when their channels close.
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto& ch : channels_)
      ch->close();
    channels_.clear();
  }
  ctx->chips.clear();
  if (failed)
    throw run_error(*failed);
  return *result;
}

} // namespace h2::actors
