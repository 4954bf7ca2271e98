// The node side of a multi-node job (every rank, rank 0 included): builds
// this node's chips and channels from the coordinator's assignment, follows
// its heartbeats, and ends the node when the coordinator finishes, aborts,
// dies or stalls.
#include "cluster_protocol.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/actors/chip_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

namespace h2::actors {

namespace {

/// Opens this node's channels and spawns its chip actors.
node_ready build_node(caf::event_based_actor* self, const node_context& ctx,
                      const node_assignment& a, std::vector<caf::actor>& out) {
  const job_config& job = *ctx.job;
  plan p = plan_from_json(a.plan_json, "the coordinator's plan");
  validate_plan(p, job, "the coordinator's plan");
  // The run's origin on this node's steady clock.
  auto since = std::chrono::system_clock::now().time_since_epoch() -
               std::chrono::nanoseconds(a.origin_system_ns);
  auto origin =
    devices::chip_clock::wall_clock::now() -
    std::chrono::duration_cast<devices::chip_clock::wall_clock::duration>(
      since);
  if (!a.checkpoint_marker.empty())
    runtime::check_checkpoint_marker(job.checkpoint.dir, a.checkpoint_marker,
                                     ctx.rank);
  std::vector<runtime::worker_setup> mine;
  for (auto& w :
       runtime::make_worker_setups(ctx.job, p, origin, ctx.shared->cancel))
    if (w.chip->id.node == ctx.rank) {
      w.progress = ctx.shared->watchdog->watch(w.chip->id);
      mine.push_back(std::move(w));
    }
  // A resumed run: each chip loads its own layers from the checkpoint
  // (the coordinator's node checked all of it); none crosses the network.
  std::vector<chip_options> options(mine.size());
  if (!a.resume_dir.empty()) {
    const auto manifest = runtime::read_manifest(a.resume_dir);
    if (manifest.step != a.resume_step)
      throw runtime::checkpoint_error(
        runtime::checkpoint_errc::mismatch, a.resume_dir,
        "node " + std::to_string(ctx.rank) + " reads step " +
          std::to_string(manifest.step) + ", the coordinator step " +
          std::to_string(a.resume_step));
    for (std::size_t i = 0; i < mine.size(); ++i)
      for (const auto& c : mine[i].chunks) {
        auto layers = runtime::read_layers(a.resume_dir, manifest,
                                           c.first_layer, c.end_layer);
        options[i].restore.insert(options[i].restore.end(),
                                  std::make_move_iterator(layers.begin()),
                                  std::make_move_iterator(layers.end()));
      }
  }
  runtime::wire_channels(mine, a.links, job, ctx.shared->endpoint.get(),
                         std::chrono::steady_clock::now() +
                           std::chrono::seconds(60),
                         [&](const std::shared_ptr<transport::channel>& ch) {
                           ctx.shared->keep(ch);
                         });
  node_ready ready;
  ready.rank = ctx.rank;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    auto& w = mine[i];
    options[i].writer = ctx.shared->writer;
    ready.chips.push_back(w.chip->id);
    auto chip = self->system().spawn<caf::detached>(chip_actor, std::move(w),
                                                    std::move(options[i]));
    ready.actors.push_back(chip);
    out.push_back(chip);
  }
  return ready;
}

struct node_state {
  node_context ctx;
  /// Checks the coordinator's sealed messages.
  std::unique_ptr<transport::control_verifier> verifier;
  drop_log drops;
  std::vector<caf::actor> chips;
  bool done = false;
  /// Whether this node watches the coordinator yet (from its join on).
  bool watching = false;
  /// When the coordinator last showed it lives (its heartbeats).
  std::chrono::steady_clock::time_point coordinator_seen =
    std::chrono::steady_clock::now();
  static inline const char* name = "h2.node";
};

using node_self = caf::stateful_actor<node_state>*;

/// Ends the node: stops its chips, tells the main thread `err` (none: a
/// clean end), quits.
void end_node(node_self self, const caf::error& err) {
  auto& st = self->state;
  if (st.done)
    return;
  st.done = true;
  if (err)
    st.ctx.shared->close_all();
  for (auto& chip : st.chips)
    self->send_exit(chip, caf::exit_reason::user_shutdown);
  st.chips.clear();
  self->send(st.ctx.waiter, done_atom::value, err, runtime::run_summary{},
             std::vector<runtime::parameter_values>{});
  self->quit();
}

/// Whether a sealed message of `type` came from the coordinator; else
/// drops it with a log line.
bool from_coordinator(node_self self, std::string_view type,
                      const transport::control_seal& seal,
                      const std::string& payload, const char* what) {
  auto& st = self->state;
  if (seal.sender == st.ctx.coordinator_rank &&
      st.verifier->accept(type, seal, payload))
    return true;
  st.drops.dropped(st.ctx.log, std::string("a ") + what +
                                 " without the coordinator's valid seal");
  return false;
}

/// From the node's join on: ends the node when the coordinator's process
/// ends or its connection breaks (a CAF monitor), or, on other ranks, when
/// its heartbeats stop. Once only: the join and the first assignment both
/// call it, in either order.
void watch_coordinator(node_self self) {
  auto& st = self->state;
  if (st.watching)
    return;
  st.watching = true;
  self->monitor(st.ctx.coordinator);
  if (st.ctx.rank != st.ctx.coordinator_rank) {
    st.coordinator_seen = std::chrono::steady_clock::now();
    self->delayed_send(self, heartbeat_interval, check_atom::value);
  }
}

caf::behavior node_actor(node_self self, node_context ctx) {
  self->state.ctx = std::move(ctx);
  self->state.verifier =
    std::make_unique<transport::control_verifier>(self->state.ctx.secret);
  self->set_down_handler([self](caf::down_msg& m) {
    if (m.source == self->state.ctx.coordinator.address())
      end_node(self,
               make_error(errc::peer_lost,
                          "lost the coordinator (node " +
                            std::to_string(self->state.ctx.coordinator_rank) +
                            "): its process ended or its connection broke"));
  });
  return {
    [self](assign_atom, const node_assignment& a) -> caf::result<node_ready> {
      if (!from_coordinator(self, assign_order, a.seal, assignment_payload(a),
                            "plan assignment"))
        return make_error(errc::unauthorized,
                          "node " + std::to_string(self->state.ctx.rank) +
                            ": a plan assignment without the coordinator's "
                            "valid seal");
      watch_coordinator(self);
      try {
        return build_node(self, self->state.ctx, a, self->state.chips);
      } catch (...) {
        self->state.ctx.shared->close_all();
        return current_exception_error();
      }
    },
    [self](joined_atom) { watch_coordinator(self); },
    [self](heartbeat_atom, const transport::control_seal& seal) {
      if (from_coordinator(self, coordinator_heartbeat, seal, "", "heartbeat"))
        self->state.coordinator_seen = std::chrono::steady_clock::now();
    },
    [self](check_atom) {
      if (self->state.done || !self->state.watching)
        return;
      if (std::chrono::steady_clock::now() - self->state.coordinator_seen >
          heartbeat_timeout) {
        const int lead = self->state.ctx.coordinator_rank;
        end_node(self, make_error(errc::peer_lost,
                                  "the coordinator (node " +
                                    std::to_string(lead) + ", " +
                                    chips_of(*self->state.ctx.job, lead) +
                                    ") stalled: no heartbeat for " +
                                    std::to_string(heartbeat_timeout.count()) +
                                    " s"));
        return;
      }
      self->delayed_send(self, heartbeat_interval, check_atom::value);
    },
    [self](summary_atom, const runtime::step_summary& s) {
      if (self->state.ctx.observer != nullptr)
        self->state.ctx.observer->on_step(s);
    },
    [self](finish_atom, const transport::control_seal& seal) {
      if (from_coordinator(self, finish_order, seal, "", "finish"))
        end_node(self, caf::error{});
    },
    [self](abort_atom, std::uint8_t code, const std::string& why,
           const transport::control_seal& seal) {
      if (from_coordinator(self, abort_order, seal, abort_payload(code, why),
                           "abort"))
        end_node(self, make_error(static_cast<errc>(code), why));
    },
  };
}
} // namespace

caf::actor spawn_node_actor(caf::actor_system& system, node_context ctx) {
  return system.spawn<caf::detached>(node_actor, std::move(ctx));
}

} // namespace h2::actors
