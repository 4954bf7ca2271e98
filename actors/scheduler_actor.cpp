#include "h2/actors/scheduler_actor.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/actors/errors.hpp"
#include "h2/actors/messages.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/runtime/migration.hpp"
#include "h2/runtime/run_controller.hpp"
#include "h2/runtime/step_control.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iterator>
#include <optional>

namespace h2::actors {

struct scheduler_state {
  static inline const char* name = "h2.scheduler";

  std::shared_ptr<run_context> ctx;
  caf::response_promise done;
  /// Where the run stands and what each boundary does (made by train).
  std::optional<runtime::run_controller> control;
  double virtual_barrier = 0;
  std::optional<runtime::run_totals> totals;
  int saved_step = -1; ///< the step of the last checkpoint started here

  /// The checkpoint being written: started at a step boundary, done once
  /// its manifest is on disk.
  struct save_in_progress {
    std::int64_t step = 0;
    std::vector<runtime::file_record> files; ///< written so far, any order
    double waited_seconds = 0; ///< for the previous save to end
    double stall_seconds = 0;  ///< the wait plus the snapshot
  };
  std::optional<save_in_progress> saving;
  /// What waits for `saving` to end (the next save, or the run's end).
  std::function<void()> after_save;

  /// The held step boundary while paused (h2-admin pause), and whether a
  /// hold tick (a look at the stop flag) is on its way.
  std::function<void()> held;
  bool ticking = false;
};

namespace {

using self_ptr = caf::stateful_actor<scheduler_state>*;

using clock = std::chrono::steady_clock;

/// How often a paused scheduler looks at the stop flag (a signal sets it
/// from outside the actor system).
constexpr std::chrono::milliseconds hold_tick{100};

double seconds_since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

/// Ends the run with `err` (once).
void fail(self_ptr self, const caf::error& err) {
  auto& st = self->state;
  st.after_save = nullptr;
  if (st.done.pending())
    st.done.deliver(err);
}

/// Whether the message in hand comes from this scheduler (its timers, its
/// writer's callbacks): messages only it may send are dropped otherwise
/// (docs/transport.md, "Control messages").
bool from_itself(self_ptr self) {
  const auto& from = self->current_sender();
  return from && from->id() == self->id() && from->node() == self->node();
}

/// The stages (chunks) of the replica-0 chip that sent the message in hand:
/// the chips that write layer files; empty for any other sender.
std::vector<stage_plan> saving_chunks(self_ptr self) {
  const auto& from = self->current_sender();
  const auto& ctx = *self->state.ctx;
  const auto& replica = ctx.the_plan.replicas.front();
  const auto chips = replica_chips(replica);
  std::vector<stage_plan> out;
  if (!from)
    return out;
  for (std::size_t i = 0; i < chips.size() && i < ctx.chips.size(); ++i)
    if (ctx.chips[i] && from->id() == ctx.chips[i].id() &&
        from->node() == ctx.chips[i].node())
      for (const auto& s : replica.stages)
        if (s.chip == chips[i])
          out.push_back(s);
  return out;
}

/// The chips a snapshot asks (the first of ctx.chips): replica 0's; under
/// ZeRO-1 all, each gathering its moments with its rings.
std::size_t snapshot_chips(const run_context& ctx) {
  return ctx.the_plan.shards_optimizer()
           ? ctx.chips.size()
           : replica_chips(ctx.the_plan.replicas.front()).size();
}

/// Makes one request of each of the first `count` chips (plan order:
/// replica 0's stages first) through `ask(i, timeout)`; calls `on_all`
/// with the replies in chip order, or delivers the root cause of the
/// failures to the run's promise.
template <class Reply, class OnAll, class Ask>
void gather_with(self_ptr self, std::size_t count, OnAll on_all, Ask ask) {
  struct pending {
    std::vector<Reply> replies;
    std::vector<failure> failures;
    std::size_t outstanding;
  };
  auto p = std::make_shared<pending>();
  p->replies.resize(count);
  p->outstanding = count;
  auto finish = [self, p, on_all] {
    if (--p->outstanding != 0)
      return;
    if (!p->failures.empty()) {
      const auto cause = root_cause(p->failures);
      fail(self, make_error(cause.code, cause.message));
      return;
    }
    on_all(std::move(p->replies));
  };
  const auto& ctx = *self->state.ctx;
  const auto ids = plan_chips(ctx.the_plan);
  const auto timeout = step_timeout(*ctx.job);
  for (std::size_t i = 0; i < count; ++i)
    ask(i, timeout)
      .then(
        [p, i, finish](Reply& r) {
          p->replies[i] = std::move(r);
          finish();
        },
        [self, p, finish, chip = ids.at(i)](caf::error& e) {
          p->failures.push_back(
            request_failure(e, *self->state.ctx->job, chip));
          finish();
        });
}

/// Sends `xs...` to the first `count` chips (gather_with).
template <class Reply, class OnAll, class... Ts>
void gather_first(self_ptr self, std::size_t count, OnAll on_all, Ts... xs) {
  gather_with<Reply>(self, count, std::move(on_all),
                     [self, xs...](std::size_t i, auto timeout) {
                       return self->request(self->state.ctx->chips[i],
                                            timeout, xs...);
                     });
}

/// Sends `xs...` to every chip (gather_first over all of them).
template <class Reply, class OnAll, class... Ts>
void gather(self_ptr self, OnAll on_all, Ts... xs) {
  gather_first<Reply>(self, self->state.ctx->chips.size(), std::move(on_all),
                      xs...);
}

void next_step(self_ptr self);
void after_step(self_ptr self);

/// Suspends this process's progress watchdog until `then` runs (a
/// rebalance, a pause or a checkpoint wait is no stall), and returns what
/// resumes it and runs `then`.
std::function<void()> watchdog_held(self_ptr self, std::function<void()> then) {
  auto& watchdog = self->state.ctx->watchdog;
  if (!watchdog)
    return then;
  watchdog->suspend();
  return [watchdog, then = std::move(then)] {
    watchdog->resume(runtime::watchdog_clock::now());
    then();
  };
}

/// Runs `then` once no checkpoint is being written.
void when_saved(self_ptr self, std::function<void()> then) {
  auto& st = self->state;
  if (st.saving)
    st.after_save = watchdog_held(self, std::move(then));
  else
    then();
}

/// Saves a checkpoint after st.step steps (docs/checkpoints.md), then
/// `then()`. A save in progress is waited for first (the step waits).
/// Replica 0's chips copy their layers to host memory (the training stall)
/// and hand them to their node's writer; `then()` runs once every chip has,
/// while the files are written. The layer files' records come back as
/// written_atom messages, the manifest is published through the driving
/// node's writer, and saved_atom ends the save. Without a writer, or when
/// this step is saved already, just `then()`. `waited`: seconds the step
/// already waited for the previous save.
void save_checkpoint(self_ptr self, std::function<void()> then,
                     double waited = 0) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  const int step = st.control->step();
  if (!ctx.checkpoints || step == st.saved_step) {
    then();
    return;
  }
  if (st.saving) {
    st.after_save =
      watchdog_held(self, [self, then = std::move(then), since = clock::now()] {
        save_checkpoint(self, then, seconds_since(since));
      });
    return;
  }
  const auto start = clock::now();
  st.saved_step = step;
  auto id = runtime::identity_of(ctx.manifest);
  id.step = step;
  try {
    runtime::prepare_checkpoint_dir(ctx.checkpoints->root(), id);
  } catch (...) {
    fail(self, current_exception_error());
    return;
  }
  st.saving = scheduler_state::save_in_progress{step, {}, waited, waited};
  st.control->save_started();
  const auto owners = snapshot_chips(ctx);
  gather_first<std::int32_t>(
    self, owners,
    [self, then = std::move(then), start, waited](std::vector<std::int32_t>) {
      auto& st = self->state;
      if (st.saving)
        st.saving->stall_seconds = waited + seconds_since(start);
      then();
    },
    snapshot_atom::value, id.step, id.job_id, id.model_digest);
}

/// A node's writer wrote some of the saving checkpoint's layer files: once
/// every layer's file is written, publishes the manifest.
void on_written(self_ptr self, const std::vector<stage_plan>& chunks,
                std::int64_t step, std::vector<runtime::file_record> files) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  if (!st.saving || st.saving->step != step)
    return;
  auto& all = st.saving->files;
  if (!runtime::files_of_chip(files, chunks, all))
    return; // not what this chip's snapshot wrote: forged or repeated
  all.insert(all.end(), std::make_move_iterator(files.begin()),
             std::make_move_iterator(files.end()));
  if (static_cast<int>(all.size()) < ctx.job->model.num_layers())
    return;
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a.layer < b.layer; });
  auto manifest = ctx.manifest;
  runtime::at_step(manifest, step);
  manifest.files = std::move(all);
  ctx.checkpoints->publish(
    std::move(manifest),
    [to = caf::actor_cast<caf::actor>(self), step](std::exception_ptr e) {
      // As from the scheduler itself: it obeys no other sender.
      caf::send_as(to, to, saved_atom::value, step,
                   e ? exception_error(e) : caf::error{});
    });
}

/// The saving checkpoint's manifest is on disk.
void on_saved(self_ptr self, std::int64_t step) {
  auto& st = self->state;
  if (!st.saving || st.saving->step != step)
    return;
  const auto done = std::move(*st.saving);
  st.saving.reset();
  st.control->save_ended();
  if (st.ctx->observer != nullptr)
    st.ctx->observer->on_checkpoint(static_cast<int>(step),
                                    done.waited_seconds, done.stall_seconds);
  if (auto next = std::exchange(st.after_save, nullptr))
    next();
}

void finish(self_ptr self, bool stopped_early) {
  save_checkpoint(self, [self, stopped_early] {
    when_saved(self, [self, stopped_early] {
      auto& st = self->state;
      if (st.done.pending())
        st.done.deliver(st.totals->summary(stopped_early));
    });
  });
}

void on_updates(self_ptr self, const runtime::update_decision& decision,
                const std::vector<runtime::chip_step_report>& steps,
                const std::vector<runtime::chip_update_report>& updates) {
  auto& st = self->state;
  const job_config& job = *st.ctx->job;
  const auto& cmd = decision.command;
  auto summary = runtime::summarize_step(
    st.control->step(), job.emulation.clock, job.tokens_per_step(), cmd.lr,
    decision.grad_norm, cmd.clip_coefficient, steps, updates);
  st.virtual_barrier = summary.virtual_end;
  st.totals->add(summary, updates, job.tokens_per_step());
  if (st.ctx->observer != nullptr)
    st.ctx->observer->on_step(summary);
  bool save_now = false;
  try {
    save_now = st.control->step_ended(summary.step_seconds, steps, updates);
  } catch (...) {
    fail(self, current_exception_error());
    return;
  }
  if (save_now) {
    save_checkpoint(self, [self] { after_step(self); });
    return;
  }
  after_step(self);
}

/// Validation when due, then the next step.
void after_step(self_ptr self) {
  auto& st = self->state;
  const job_config& job = *st.ctx->job;
  const int done = st.control->step();
  if (!runtime::eval_due(job, done, st.control->steps())) {
    next_step(self);
    return;
  }
  runtime::eval_command eval{done - 1, st.virtual_barrier};
  gather<runtime::chip_eval_report>(
    self,
    [self](std::vector<runtime::chip_eval_report> reports) {
      auto& st = self->state;
      double loss = 0;
      for (const auto& r : reports) {
        loss += r.loss;
        st.virtual_barrier =
          std::max(st.virtual_barrier, r.end.virtual_seconds);
      }
      st.totals->add_eval(loss);
      if (st.ctx->observer != nullptr)
        st.ctx->observer->on_eval(st.control->step() - 1, loss);
      next_step(self);
    },
    eval_atom::value, eval);
}

void on_steps(self_ptr self, std::vector<runtime::chip_step_report> steps) {
  auto& st = self->state;
  runtime::update_decision decision;
  try {
    decision = runtime::decide_update(*st.ctx->job, st.control->step(), steps);
  } catch (...) {
    fail(self, current_exception_error());
    return;
  }
  gather<runtime::chip_update_report>(
    self,
    [self, decision, steps = std::move(steps)](
      std::vector<runtime::chip_update_report> updates) {
      on_updates(self, decision, steps, updates);
    },
    update_atom::value, decision.command);
}

/// Ends a live re-plan to `change` that moved `moves` by `route`: the
/// moves' link time is charged on the virtual clock, the controller adopts
/// the plan, the observer hears of it; then `then()`.
void replan_done(self_ptr self, const runtime::plan_change& change,
                 const std::vector<scheduler::layer_move>& moves,
                 std::string route,
                 const std::vector<runtime::setup_report>& reports,
                 clock::time_point started, const std::function<void()>& then) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  runtime::rebalance_event e;
  e.step = st.control->step();
  e.generation = st.control->replan_ended(change.value);
  e.reason = change.reason;
  e.value = change.value;
  for (const auto& m : moves) {
    e.moves.push_back("layers [" + std::to_string(m.first_layer) + ", " +
                      std::to_string(m.end_layer) + ") " + m.from.to_string() +
                      " -> " + m.to.to_string());
    e.moved_bytes += m.bytes;
    e.charged_seconds += m.seconds;
  }
  e.route = std::move(route);
  for (const auto& r : reports)
    e.sent_bytes += static_cast<double>(r.sent_bytes);
  e.before_seconds = change.before_seconds;
  e.after_seconds = change.after_seconds;
  // The layers crossed the links one move after another.
  st.virtual_barrier += e.charged_seconds;
  e.pause_seconds = seconds_since(started);
  if (ctx.observer != nullptr) { // the line, then the new stages
    ctx.observer->on_rebalance(e);
    ctx.observer->on_setup(ctx.the_plan, reports);
  }
  then();
}

/// Moves the job to `change.value` chip to chip (docs/rebalance.md,
/// "Moving layers"): every chip sends the layers it gives up straight to
/// their new owners and keeps the others (runtime::migration).
void migrate(self_ptr self, runtime::plan_change change,
             std::vector<scheduler::layer_move> moves,
             clock::time_point started, std::function<void()> then) {
  auto& ctx = *self->state.ctx;
  const auto from = to_json(ctx.the_plan, -1), to = to_json(change.value, -1);
  const std::int64_t step = self->state.control->step();
  ctx.the_plan = change.value;
  ctx.manifest.plan_json = to; // checkpoints record the live plan
  gather_with<runtime::setup_report>(
    self, ctx.chips.size(),
    [self, change = std::move(change), moves = std::move(moves),
     then = std::move(then),
     started](std::vector<runtime::setup_report> reports) {
      replan_done(self, change, moves, "chip to chip", reports, started, then);
    },
    [self, from, to, step](std::size_t i, auto timeout) {
      return self->request(self->state.ctx->chips[i], timeout,
                           migrate_atom::value, from, to, step);
    });
}

/// Moves the job to plan `p` between steps (docs/rebalance.md): chip to
/// chip where it can (migrate()), else through the scheduler: replica 0's
/// chips copy their layers to host memory, every chip gets its layers of
/// `p` and rebuilds its stage. Then replan_done().
void replan(self_ptr self, runtime::plan_change change,
            std::function<void()> then) {
  auto& ctx = *self->state.ctx;
  self->state.control->replan_started();
  const auto started = clock::now();
  std::vector<scheduler::layer_move> moves;
  std::string indirect;
  try {
    auto m = runtime::migration_of(*ctx.job, ctx.the_plan, change.value);
    moves = std::move(m.moves);
    indirect = std::move(m.indirect);
  } catch (...) {
    fail(self, current_exception_error());
    return;
  }
  if (indirect.empty()) {
    migrate(self, std::move(change), std::move(moves), started,
            std::move(then));
    return;
  }
  const auto owners = snapshot_chips(ctx);
  gather_first<std::vector<runtime::layer_state>>(
    self, owners,
    [self, change = std::move(change), moves = std::move(moves),
     then = std::move(then), started,
     route = "through the scheduler: " + indirect](
      std::vector<std::vector<runtime::layer_state>> per_chip) {
      std::vector<runtime::layer_state> layers;
      for (auto& chip : per_chip)
        for (auto& l : chip)
          layers.push_back(std::move(l));
      std::sort(layers.begin(), layers.end(),
                [](const auto& a, const auto& b) { return a.layer < b.layer; });
      auto& ctx = *self->state.ctx;
      ctx.the_plan = change.value;
      const auto json = to_json(change.value, -1);
      ctx.manifest.plan_json = json; // checkpoints record the live plan
      // Each chip's layers of the new plan, in plan order.
      auto slices =
        std::make_shared<std::vector<std::vector<runtime::layer_state>>>();
      for (const auto& rep : change.value.replicas)
        for (const auto& chip : replica_chips(rep)) {
          auto& slice = slices->emplace_back();
          for (const auto& s : rep.stages)
            if (s.chip == chip)
              slice.insert(slice.end(), layers.begin() + s.first_layer,
                           layers.begin() + s.end_layer);
        }
      gather_with<runtime::setup_report>(
        self, ctx.chips.size(),
        [self, change, moves, then, started,
         route](std::vector<runtime::setup_report> reports) {
          replan_done(self, change, moves, route, reports, started, then);
        },
        [self, json, slices](std::size_t i, auto timeout) {
          return self->request(self->state.ctx->chips[i], timeout,
                               replan_atom::value, json,
                               std::move((*slices)[i]));
        });
    },
    layers_atom::value);
}

/// Applies `drills` one after another (each throttles or restores its
/// chip), then `then()`.
void run_drills(self_ptr self, std::vector<drill> drills,
                std::function<void()> then) {
  auto& st = self->state;
  if (drills.empty()) {
    then();
    return;
  }
  const drill d = drills.front();
  drills.erase(drills.begin());
  const auto ids = plan_chips(st.ctx->the_plan);
  const auto at = std::find(ids.begin(), ids.end(), d.chip);
  if (at == ids.end()) { // a chip excluded after a restart
    run_drills(self, std::move(drills), std::move(then));
    return;
  }
  const auto& chip = st.ctx->chips[static_cast<std::size_t>(at - ids.begin())];
  auto failed = [self, chip = d.chip](caf::error& e) {
    const auto f = request_failure(e, *self->state.ctx->job, chip);
    fail(self, make_error(f.code, f.message));
  };
  auto go_on = [self, d, drills = std::move(drills),
                then = std::move(then)]() mutable {
    if (!d.hang) // a hang changes no chip's speed
      self->state.control->drill_applied(d);
    run_drills(self, std::move(drills), std::move(then));
  };
  const auto timeout = step_timeout(*st.ctx->job);
  if (d.hang)
    self->request(chip, timeout, hang_atom::value)
      .then([go_on = std::move(go_on)](bool) mutable { go_on(); }, failed);
  else
    self->request(chip, timeout, throttle_atom::value, d.factor)
      .then([go_on = std::move(go_on)](double) mutable { go_on(); }, failed);
}

/// Looks at the stop flag while paused, until the hold ends.
void arm_hold_tick(self_ptr self) {
  auto& st = self->state;
  if (st.held && !std::exchange(st.ticking, true))
    self->delayed_send(self, hold_tick, wake_atom::value, true);
}

/// Takes the held step boundary again (a resume, a stop).
void release(self_ptr self) {
  if (auto next = std::exchange(self->state.held, nullptr))
    next();
}

void next_step(self_ptr self) {
  auto& st = self->state;
  auto action = st.control->at_boundary();
  auto again = [self] {
    next_step(self);
  };
  using kind = runtime::boundary_action::kind;
  switch (action.what) {
    case kind::finish:
      finish(self, action.stopped_early);
      return;
    case kind::checkpoint:
      save_checkpoint(self, again);
      return;
    case kind::drills:
      run_drills(self, std::move(action.drills), again);
      return;
    case kind::replan:
      replan(self, std::move(*action.change), watchdog_held(self, again));
      return;
    case kind::hold:
      st.held = watchdog_held(self, again);
      arm_hold_tick(self);
      return;
    case kind::step:
      break;
  }
  runtime::step_command cmd{st.control->step(), st.virtual_barrier};
  gather<runtime::chip_step_report>(
    self,
    [self](std::vector<runtime::chip_step_report> steps) {
      on_steps(self, std::move(steps));
    },
    step_atom::value, cmd);
}

/// Answers the admin inbox's commands (runtime::run_controller carries
/// them out), and ends a hold that a resume, a stop or a signal ended.
void on_wake(self_ptr self) {
  auto& st = self->state;
  if (st.ctx->admin)
    for (auto& c : st.ctx->admin->take()) {
      runtime::admin_reply reply;
      bool release_now = false;
      try {
        auto outcome = st.control->execute(c.value, st.ctx->the_plan);
        reply = {true, std::move(outcome.json)};
        release_now = outcome.release;
      } catch (const std::exception& e) { // admin_error, config_error
        reply.body = e.what();
      }
      c.reply->set_value(std::move(reply));
      if (release_now)
        release(self);
    }
  if (st.held && st.control->stop_requested())
    release(self);
  arm_hold_tick(self);
}

caf::behavior scheduler_actor(self_ptr self, std::shared_ptr<run_context> ctx) {
  self->state.ctx = std::move(ctx);
  // A bug that throws here must still answer the run's caller.
  self->set_exception_handler([self](std::exception_ptr& e) {
    auto err = exception_error(e);
    if (self->state.done.pending())
      self->state.done.deliver(err);
    return err;
  });
  return {
    [self](train_atom, int steps) -> caf::result<runtime::run_summary> {
      auto& st = self->state;
      if (st.totals) // one run per scheduler
        return make_error(errc::failed, "the scheduler runs already");
      if (!st.ctx->stop) // h2-admin stop
        st.ctx->stop = std::make_shared<std::atomic<int>>(0);
      const auto& ctx = *st.ctx;
      try {
        st.control.emplace(runtime::run_controller::options{
          ctx.job, ctx.the_plan, ctx.first_step, steps, ctx.replans, ctx.stop,
          ctx.checkpoints != nullptr,
          ctx.job->rebalance.policy != rebalance_mode::off ||
            ctx.admin != nullptr});
      } catch (...) {
        return current_exception_error();
      }
      st.done = self->make_response_promise();
      st.saved_step = ctx.first_step; // a resumed run's start is saved
      st.totals.emplace(steps);
      if (ctx.admin)
        ctx.admin->open([to = caf::actor_cast<caf::actor>(self)] {
          // As from the scheduler itself: it obeys no other sender.
          caf::send_as(to, to, wake_atom::value, false);
        });
      gather<runtime::setup_report>(
        self,
        [self](std::vector<runtime::setup_report> reports) {
          auto& st = self->state;
          if (st.ctx->observer != nullptr)
            st.ctx->observer->on_setup(st.ctx->the_plan, reports);
          next_step(self);
        },
        setup_atom::value);
      return st.done;
    },
    [self](written_atom, std::int64_t step,
           std::vector<runtime::file_record>& files, const caf::error& err) {
      const auto chunks = saving_chunks(self);
      if (chunks.empty())
        return; // not from a chip that writes layer files
      if (err)
        fail(self, err);
      else
        on_written(self, chunks, step, std::move(files));
    },
    [self](wake_atom, bool tick) {
      auto& st = self->state;
      if (!from_itself(self) || !st.control)
        return;
      if (tick)
        st.ticking = false;
      on_wake(self);
    },
    [self](saved_atom, std::int64_t step, const caf::error& err) {
      if (!from_itself(self))
        return;
      if (err)
        fail(self, err);
      else
        on_saved(self, step);
    },
  };
}

} // namespace

caf::actor spawn_scheduler(caf::actor_system& system,
                           std::shared_ptr<run_context> ctx) {
  return system.spawn(scheduler_actor, std::move(ctx));
}

} // namespace h2::actors
