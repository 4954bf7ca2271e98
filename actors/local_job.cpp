#include "h2/actors/local_job.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/actors/chip_actor.hpp"
#include "h2/actors/errors.hpp"
#include "h2/actors/messages.hpp"
#include "h2/actors/scheduler_actor.hpp"
#include "h2/runtime/links.hpp"

#include <algorithm>
#include <caf/actor_system.hpp>
#include <caf/scoped_actor.hpp>

namespace h2::actors {

void configure_actor_system(caf::actor_system_config& cfg) {
  using namespace runtime;
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
  cfg.add_message_type<state_tensor>("h2.state_tensor");
  cfg.add_message_type<layer_state>("h2.layer_state");
  cfg.add_message_type<std::vector<layer_state>>("h2.layer_states");
  cfg.add_message_type<tensor_record>("h2.tensor_record");
  cfg.add_message_type<file_record>("h2.file_record");
  cfg.add_message_type<std::vector<file_record>>("h2.file_records");
  cfg.add_error_category(error_category, render_error);
  // Chips run on threads of their own (detached); CAF's scheduler threads
  // only carry light work and must not busy-poll the cores the chips
  // compute on.
  cfg.set("work-stealing.aggressive-poll-attempts", 1);
  cfg.set("work-stealing.moderate-poll-attempts", 1);
}

local_job::local_job(std::shared_ptr<const job_config> job, plan p)
    : job_(std::move(job)), plan_(std::move(p)) {
}

local_job::~local_job() = default;

std::vector<runtime::parameter_values>
local_job::parameters_of(const chip_id& chip) const {
  auto i = chip_parameters_.find(chip);
  return i == chip_parameters_.end() ? std::vector<runtime::parameter_values>{}
                                     : i->second;
}

void local_job::abort() noexcept {
  cancel_->cancel();
  std::lock_guard<std::mutex> guard(mutex_);
  for (auto& ch : channels_)
    ch->close();
  if (writer_)
    writer_->abandon(); // the previous checkpoint stays the latest
}

std::shared_ptr<run_context>
local_job::context_of(const run_options& opts,
                      runtime::training_observer& observer,
                      std::shared_ptr<std::atomic<int>> stop) {
  auto ctx = std::make_shared<run_context>();
  ctx->job = job_;
  ctx->the_plan = plan_;
  ctx->observer = &observer;
  ctx->stop = std::move(stop);
  ctx->admin = opts.admin;
  if (opts.resume)
    ctx->first_step = static_cast<int>(opts.resume->manifest.step);
  check_replans(opts.replans, plan_, *job_);
  ctx->replans = opts.replans;
  if (!job_->checkpoint.dir.empty()) {
    ctx->manifest = runtime::job_manifest(*job_, plan_, opts.job_text);
    if (opts.resume) // the same job goes on
      ctx->manifest.job_id = opts.resume->manifest.job_id;
    ctx->checkpoints = std::make_shared<runtime::checkpoint_writer>(
      job_->checkpoint.dir, job_->checkpoint.keep);
    std::lock_guard<std::mutex> guard(mutex_);
    writer_ = ctx->checkpoints;
  }
  ctx->watchdog = std::make_shared<runtime::progress_watchdog>(job_->watchdog);
  return ctx;
}

void local_job::spawn_chips(caf::actor_system& system, run_context& ctx,
                            const run_options& opts) {
  // Every chip runs in this process: every node rank maps to it, so every
  // pair of chips is joined in-process.
  std::map<int, transport::endpoint_address> here;
  for (const auto* c : job_->chips())
    here[c->id.node].node_rank = 0;
  auto setups = runtime::make_worker_setups(
    job_, plan_, devices::chip_clock::wall_clock::now(), cancel_);
  for (auto& w : setups)
    w.progress = ctx.watchdog->watch(w.chip->id);
  runtime::wire_channels(
    setups,
    runtime::assign_links(plan_, here, "", job_->model.tie_embeddings)[0],
    *job_, nullptr, transport::deadline::max(),
    [this](const std::shared_ptr<transport::channel>& ch) {
      std::lock_guard<std::mutex> guard(mutex_);
      channels_.push_back(ch);
    });
  for (auto& w : setups) {
    chip_options co;
    co.writer = ctx.checkpoints;
    if (opts.resume)
      for (const auto& c : w.chunks)
        for (int l = c.first_layer; l < c.end_layer; ++l)
          co.restore.push_back(
            opts.resume->layers.at(static_cast<std::size_t>(l)));
    ctx.chips.push_back(
      system.spawn<caf::detached>(chip_actor, std::move(w), std::move(co)));
  }
}

std::optional<failure> local_job::collect_parameters(caf::scoped_actor& self,
                                                     const run_context& ctx) {
  std::optional<failure> failed;
  // Chips come replica by replica (plan_chips()): replica 0's first.
  const auto stages = replica_chips(plan_.replicas.front()).size();
  const auto order = plan_chips(plan_);
  for (std::size_t i = 0; i < ctx.chips.size() && !failed; ++i)
    self->request(ctx.chips[i], step_timeout(*job_), params_atom::value)
      .receive(
        [&](std::vector<runtime::parameter_values>& ps) {
          if (i < stages)
            parameters_.insert(parameters_.end(), ps.begin(), ps.end());
          chip_parameters_[order[i]] = std::move(ps);
        },
        [&](caf::error& e) { failed = request_failure(e, *job_, order[i]); });
  // Layer order, as the single model lists them.
  std::stable_sort(
    parameters_.begin(), parameters_.end(),
    [](const auto& a, const auto& b) { return a.layer < b.layer; });
  return failed;
}

void local_job::release(run_context& ctx, bool failed) {
  // A failed run's save in progress is given up; a finished run's is on
  // disk already (the scheduler answers once it is). Either way the writer
  // stops before the actors its callbacks talk to go away.
  if (ctx.checkpoints) {
    if (failed)
      ctx.checkpoints->abandon();
    ctx.checkpoints->close();
    std::lock_guard<std::mutex> guard(mutex_);
    writer_.reset();
  }
  // Chips still at work on a failed run (a step past its timeout, say) stop:
  // their waits end and their op loops throw. Chips blocked in a channel
  // wait end it when their channels close.
  if (failed)
    cancel_->cancel();
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto& ch : channels_)
      ch->close();
    channels_.clear();
  }
  ctx.chips.clear();
}

runtime::run_summary local_job::run(const run_options& opts,
                                    runtime::training_observer& observer,
                                    std::shared_ptr<std::atomic<int>> stop) {
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  caf::actor_system system{cfg};
  auto ctx = context_of(opts, observer, std::move(stop));
  spawn_chips(system, *ctx, opts);
  // A stalled chip fails the run: its op ends with stalled_error (the
  // root cause the scheduler reports), every other wait with the abort.
  runtime::watchdog_thread watchdog(ctx->watchdog,
                                    [this](const runtime::stall&) { abort(); });
  auto sched = spawn_scheduler(system, ctx);
  std::optional<runtime::run_summary> result;
  std::optional<failure> failed;
  {
    caf::scoped_actor self{system};
    // No deadline for the whole run: every request the scheduler makes of a
    // chip has one (runtime.step_timeout_seconds), so it always answers.
    self->request(sched, caf::infinite, train_atom::value, opts.steps)
      .receive([&](runtime::run_summary& s) { result = s; },
               [&](caf::error& e) { failed = to_failure(e); });
    if (opts.admin)
      opts.admin->close();
    parameters_.clear();
    chip_parameters_.clear();
    if (!failed && opts.collect_parameters)
      failed = collect_parameters(self, *ctx);
    for (auto& chip : ctx->chips)
      self->send_exit(chip, caf::exit_reason::user_shutdown);
    self->send_exit(sched, caf::exit_reason::user_shutdown);
  }
  release(*ctx, failed.has_value());
  if (failed) {
    if (auto stalled = watchdog.stalled())
      failed = failure{errc::stalled, stalled->message()};
    throw run_error(*failed);
  }
  return *result;
}

} // namespace h2::actors
