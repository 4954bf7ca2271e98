#include "h2/actors/scheduler_actor.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/actors/errors.hpp"
#include "h2/model/optim.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>
#include <caf/stateful_actor.hpp>

#include <cmath>

namespace h2::actors {

struct scheduler_state {
  static inline const char* name = "h2.scheduler";

  std::shared_ptr<run_context> ctx;
  caf::response_promise done;
  int steps = 0;
  int step = 0;
  double virtual_barrier = 0;
  run_summary summary;
  double timed_seconds = 0; ///< steps after the first (run clock)
  double timed_tokens = 0;
  double bubble_sum = 0;
};

namespace {

using self_ptr = caf::stateful_actor<scheduler_state>*;

/// Sends `xs...` to every chip; calls `on_all` with the replies in chip
/// order, or delivers the root cause of the failures to the run's promise.
template <class Reply, class OnAll, class... Ts>
void gather(self_ptr self, OnAll on_all, Ts... xs) {
  const auto& chips = self->state.ctx->chips;
  struct pending {
    std::vector<Reply> replies;
    std::vector<failure> failures;
    std::size_t outstanding;
  };
  auto p = std::make_shared<pending>();
  p->replies.resize(chips.size());
  p->outstanding = chips.size();
  auto finish = [self, p, on_all] {
    if (--p->outstanding != 0)
      return;
    if (!p->failures.empty()) {
      self->state.done.deliver(make_error(root_cause(p->failures).code,
                                          root_cause(p->failures).message));
      return;
    }
    on_all(std::move(p->replies));
  };
  for (std::size_t i = 0; i < chips.size(); ++i)
    self->request(chips[i], caf::infinite, xs...)
      .then(
        [p, i, finish](Reply& r) {
          p->replies[i] = std::move(r);
          finish();
        },
        [p, finish](caf::error& e) {
          p->failures.push_back(to_failure(e));
          finish();
        });
}

void next_step(self_ptr self);

void finish(self_ptr self) {
  auto& st = self->state;
  auto& s = st.summary;
  if (st.timed_seconds > 0) {
    s.mean_step_seconds = st.timed_seconds / std::max(1, s.steps - 1);
    s.tokens_per_second = st.timed_tokens / st.timed_seconds;
  }
  s.mean_bubble_fraction = s.steps > 0 ? st.bubble_sum / s.steps : 0;
  st.done.deliver(s);
}

bool eval_due(const job_config& job, int completed, int steps) {
  int every = job.train.eval_every;
  return every > 0 && (completed % every == 0 || completed == steps);
}

void on_updates(self_ptr self, double lr, double grad_norm, double clip,
                const std::vector<chip_step_report>& steps,
                const std::vector<chip_update_report>& updates) {
  auto& st = self->state;
  const job_config& job = *st.ctx->job;
  auto summary =
    summarize_step(st.step, job.emulation.clock, job.tokens_per_step(), lr,
                   grad_norm, clip, steps, updates);
  st.virtual_barrier = summary.virtual_end;
  auto& s = st.summary;
  s.steps = st.step + 1;
  s.final_loss = summary.loss;
  s.virtual_seconds = summary.virtual_end;
  for (const auto& u : updates)
    s.wall_seconds = std::max(s.wall_seconds, u.end.wall_seconds);
  // The first step pays for warm-up (allocations, caches): leave it out of
  // the averages when there are others.
  if (st.step > 0 || st.steps == 1) {
    st.timed_seconds += summary.step_seconds;
    st.timed_tokens += static_cast<double>(job.tokens_per_step());
  }
  st.bubble_sum += summary.bubble_fraction;
  if (st.ctx->observer != nullptr)
    st.ctx->observer->on_step(summary);
  ++st.step;
  if (!eval_due(job, st.step, st.steps)) {
    next_step(self);
    return;
  }
  eval_command cmd{st.step - 1, st.virtual_barrier};
  gather<chip_eval_report>(
    self,
    [self](std::vector<chip_eval_report> reports) {
      auto& st = self->state;
      double loss = 0;
      for (const auto& r : reports) {
        loss += r.loss;
        st.virtual_barrier =
          std::max(st.virtual_barrier, r.end.virtual_seconds);
      }
      st.summary.final_val_loss = loss;
      if (st.ctx->observer != nullptr)
        st.ctx->observer->on_eval(st.step - 1, loss);
      next_step(self);
    },
    eval_atom::value, cmd);
}

void on_steps(self_ptr self, std::vector<chip_step_report> steps) {
  auto& st = self->state;
  const job_config& job = *st.ctx->job;
  double norm = grad_norm_of(steps);
  if (!std::isfinite(norm)) {
    // Applying it would turn every weight into NaN: stop, as Megatron does.
    double loss = 0;
    for (const auto& r : steps)
      loss += r.loss;
    st.done.deliver(make_error(
      errc::failed, "step " + std::to_string(st.step + 1) +
                      ": the global gradient norm is not finite (loss " +
                      std::to_string(loss) +
                      "); lower train.lr or enable train.grad_clip"));
    return;
  }
  double clip = model::clip_coefficient(norm, job.train.grad_clip);
  double lr = model::learning_rate(job.train, st.step);
  update_command cmd{st.step, lr, clip, virtual_phase_end(steps)};
  gather<chip_update_report>(
    self,
    [self, lr, norm, clip,
     steps = std::move(steps)](std::vector<chip_update_report> updates) {
      on_updates(self, lr, norm, clip, steps, updates);
    },
    update_atom::value, cmd);
}

void next_step(self_ptr self) {
  auto& st = self->state;
  if (st.step >= st.steps) {
    finish(self);
    return;
  }
  if (st.ctx->stop && st.ctx->stop->load() != 0) {
    st.summary.stopped_early = true;
    finish(self);
    return;
  }
  step_command cmd{st.step, st.virtual_barrier};
  gather<chip_step_report>(
    self,
    [self](std::vector<chip_step_report> steps) {
      on_steps(self, std::move(steps));
    },
    step_atom::value, cmd);
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
    [self](train_atom, int steps) -> caf::result<run_summary> {
      auto& st = self->state;
      st.done = self->make_response_promise();
      st.steps = steps;
      gather<setup_report>(
        self,
        [self](std::vector<setup_report> reports) {
          auto& st = self->state;
          if (st.ctx->observer != nullptr)
            st.ctx->observer->on_setup(st.ctx->the_plan, reports);
          next_step(self);
        },
        setup_atom::value);
      return st.done;
    },
  };
}

} // namespace

caf::actor spawn_scheduler(caf::actor_system& system,
                           std::shared_ptr<run_context> ctx) {
  return system.spawn(scheduler_actor, std::move(ctx));
}

} // namespace h2::actors
