#include "h2/actors/chip_actor.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/actors/errors.hpp"
#include "h2/actors/messages.hpp"

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <optional>

namespace h2::actors {

namespace {

struct chip_state {
  runtime::worker_setup setup;
  chip_options options;
  std::unique_ptr<runtime::stage_worker> worker;
  double throttle = 1; ///< survives a re-plan's new worker

  void close_channels() noexcept { setup.close_channels(); }

  /// The chip's setup under `p` (a live re-plan), on its channels: a
  /// re-plan keeps every chip's neighbours.
  runtime::worker_setup next_setup(const plan& p) const {
    std::optional<runtime::worker_setup> next;
    for (auto& w : runtime::make_worker_setups(setup.job, p, setup.origin,
                                               setup.cancel))
      if (w.chip->id == setup.chip->id)
        next = std::move(w);
    H2_ENFORCE(next.has_value(), "chip ", setup.chip->id.to_string(),
               " is not in the live re-plan");
    for (auto& [peer, link] : next->peers) {
      auto now = setup.peers.find(peer);
      H2_ENFORCE(now != setup.peers.end() && now->second.channel,
                 "a live re-plan keeps every chip's neighbours; chip ",
                 setup.chip->id.to_string(), " would need one to ",
                 peer.to_string());
      link.channel = now->second.channel;
    }
    next->progress = setup.progress; // the watchdog watches the same record
    return std::move(*next);
  }

  /// Rebuilds the stage for the chip's part of `plan_json` (the same
  /// neighbours, other layers) and loads `layers` into it (a live
  /// re-plan through the scheduler, between steps).
  void replan(const std::string& plan_json,
              const std::vector<runtime::layer_state>& layers) {
    auto next = next_setup(plan_from_json(plan_json, "the live re-plan"));
    if (worker)
      worker->detach_channels();
    worker.reset(); // its stage's memory goes first
    setup = std::move(next);
    worker = std::make_unique<runtime::stage_worker>(setup);
    if (throttle != 1)
      worker->set_throttle(throttle);
    worker->restore(layers);
  }

  /// Moves the chip from plan `from_json` to `to_json` in place before
  /// step `step`, its layers going chip to chip (stage_worker::migrate).
  /// Returns the bytes it sent.
  std::uint64_t migrate(const std::string& from_json,
                        const std::string& to_json, std::int64_t step) {
    H2_ENFORCE(worker != nullptr, "chip ", setup.chip->id.to_string(),
               " was not set up");
    const plan from = plan_from_json(from_json, "the running plan");
    const plan to = plan_from_json(to_json, "the live re-plan");
    for (const auto& w : worker->setup().chunks) // the plan it runs
      H2_ENFORCE(std::any_of(from.replicas.begin(), from.replicas.end(),
                             [&](const replica_plan& r) {
                               return std::find(r.stages.begin(),
                                                r.stages.end(),
                                                w) != r.stages.end();
                             }),
                 "chip ", setup.chip->id.to_string(),
                 " does not run the plan the re-plan starts from");
    const auto part =
      runtime::chip_part_of(*setup.job, from, to, setup.chip->id);
    auto next = next_setup(to);
    setup = next; // the actor's copy, for closing the channels
    return worker->migrate(std::move(next), part, step);
  }

  /// The report of a stage rebuilt by `rebuild` (which returns the bytes
  /// it sent), or its error, the channels closed.
  template <class F>
  caf::result<runtime::setup_report> rebuilt(F rebuild) {
    try {
      const std::uint64_t sent = rebuild();
      auto r = worker->ready_report();
      r.sent_bytes = sent;
      return r;
    } catch (...) {
      close_channels();
      worker.reset(); // half moved: nothing may call into it
      return current_exception_error();
    }
  }

  /// Runs `f` on the worker; exceptions become H2 caf::errors.
  template <class F>
  auto with_worker(F f) -> caf::result<decltype(f(*worker))> {
    if (!worker)
      return make_error(errc::internal, "chip " + setup.chip->id.to_string() +
                                          " was not set up");
    try {
      return f(*worker);
    } catch (...) {
      return current_exception_error();
    }
  }
};

} // namespace

caf::behavior chip_actor(caf::event_based_actor* self,
                         runtime::worker_setup setup, chip_options options) {
  auto state = std::make_shared<chip_state>();
  state->setup = std::move(setup);
  state->options = std::move(options);
  self->attach_functor([state] {
    // The actor is gone: free the stage and wake neighbours still waiting.
    state->close_channels();
    state->worker.reset();
  });
  return {
    [state](setup_atom) -> caf::result<runtime::setup_report> {
      try {
        state->worker = std::make_unique<runtime::stage_worker>(state->setup);
        if (!state->options.restore.empty()) {
          state->worker->restore(state->options.restore);
          state->options.restore = {}; // the host copies go
        }
        return state->worker->ready_report();
      } catch (...) {
        state->close_channels();
        return current_exception_error();
      }
    },
    [state](step_atom, const runtime::step_command& cmd) {
      return state->with_worker(
        [&](runtime::stage_worker& w) { return w.run_step(cmd); });
    },
    [state](update_atom, const runtime::update_command& cmd) {
      return state->with_worker(
        [&](runtime::stage_worker& w) { return w.apply_update(cmd); });
    },
    [state](eval_atom, const runtime::eval_command& cmd) {
      return state->with_worker(
        [&](runtime::stage_worker& w) { return w.run_eval(cmd); });
    },
    [state](params_atom) {
      return state->with_worker(
        [&](runtime::stage_worker& w) { return w.parameters(); });
    },
    [state](throttle_atom, double factor) {
      return state->with_worker([&](runtime::stage_worker& w) {
        w.set_throttle(factor);
        state->throttle = factor;
        return factor;
      });
    },
    [state](hang_atom) {
      return state->with_worker([&](runtime::stage_worker& w) {
        w.hang_next_op();
        return true;
      });
    },
    [state](layers_atom) {
      return state->with_worker(
        [&](runtime::stage_worker& w) { return w.snapshot(); });
    },
    [state](replan_atom, const std::string& plan_json,
            const std::vector<runtime::layer_state>& layers) {
      return state->rebuilt([&] {
        state->replan(plan_json, layers);
        return std::uint64_t{0};
      });
    },
    [state](migrate_atom, const std::string& from_json,
            const std::string& to_json, std::int64_t step) {
      return state->rebuilt(
        [&] { return state->migrate(from_json, to_json, step); });
    },
    [self, state](snapshot_atom, std::int64_t step, std::string& job_id,
                  std::string& model_digest) {
      return state->with_worker([&](runtime::stage_worker& w) {
        H2_ENFORCE(state->options.writer != nullptr, "chip ",
                   state->setup.chip->id.to_string(),
                   " has no checkpoint writer");
        auto layers = w.snapshot();
        const auto count = static_cast<std::int32_t>(layers.size());
        if (layers.empty()) // ZeRO-1: a replica that only gathered
          return count;
        auto to = caf::actor_cast<caf::actor>(self->current_sender());
        // The scheduler takes the records only from the chip they belong
        // to: they go as from this chip.
        state->options.writer->write_layers(
          {std::move(job_id), std::move(model_digest), step},
          std::move(layers),
          [to, step, from = caf::actor_cast<caf::actor>(self)](
            std::vector<runtime::file_record> files,
            std::exception_ptr failed) {
            caf::send_as(from, to, written_atom::value, step, std::move(files),
                         failed ? exception_error(failed) : caf::error{});
          });
        return count;
      });
    },
  };
}

} // namespace h2::actors
