// The coordinator side of a multi-node job (rank 0): admits the nodes that
// prove the job's secret, plans, assigns every node its chips and channels
// (runtime::assign_links), drives the scheduler actor over every node's chip
// actors, watches the nodes (CAF monitors and heartbeats) and ends the job
// everywhere when one fails.
#include "cluster_protocol.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/actors/scheduler_actor.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "h2/transport/handshake.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/message_view.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
#include <map>

namespace h2::actors {

namespace {

/// Passes steps to rank 0's observer and broadcasts them (without their op
/// records) to the other nodes for their metrics.
class broadcast_observer final : public runtime::training_observer {
public:
  broadcast_observer(runtime::training_observer* local,
                     std::vector<caf::actor> nodes)
      : local_(local), nodes_(std::move(nodes)) {}

  void on_setup(const plan& p,
                const std::vector<runtime::setup_report>& c) override {
    if (local_ != nullptr)
      local_->on_setup(p, c);
  }

  void on_step(const runtime::step_summary& s) override {
    if (local_ != nullptr)
      local_->on_step(s);
    runtime::step_summary slim = s;
    slim.ops.clear();
    for (const auto& n : nodes_)
      caf::anon_send(n, summary_atom::value, slim);
  }

  void on_eval(int step, double loss) override {
    if (local_ != nullptr)
      local_->on_eval(step, loss);
  }

  void on_checkpoint(int steps, double waited, double stall) override {
    if (local_ != nullptr)
      local_->on_checkpoint(steps, waited, stall);
  }

  void on_rebalance(const runtime::rebalance_event& e) override {
    if (local_ != nullptr)
      local_->on_rebalance(e);
  }

private:
  runtime::training_observer* local_;
  std::vector<caf::actor> nodes_;
};

struct member {
  caf::actor node;
  node_join info;
  std::chrono::steady_clock::time_point seen;
};

struct coordinator_state {
  node_options options;
  caf::actor waiter;
  std::shared_ptr<runtime::checkpoint_writer> writer;
  /// Nonces handed out and not yet answered, by nonce.
  struct pending_join {
    std::int32_t rank = 0;
    caf::node_id from; ///< the asking process (per-connection quota)
    std::chrono::steady_clock::time_point expires;
  };
  std::map<std::string, pending_join> nonces;
  /// Nodes that proved the secret and have yet to attach their node actor,
  /// by rank.
  std::map<int, node_join> proven;
  /// Nodes that joined: proved the secret and attached their node actor.
  std::map<int, member> members;
  /// Every node must have joined by then (options.join_timeout after the
  /// coordinator started).
  std::chrono::steady_clock::time_point join_deadline;
  std::shared_ptr<run_context> ctx;
  std::unique_ptr<broadcast_observer> observer;
  caf::actor scheduler;
  bool ended = false;
  /// Seals what the coordinator tells nodes; checks what they tell it.
  std::unique_ptr<transport::control_signer> signer;
  std::unique_ptr<transport::control_verifier> verifier;
  drop_log drops;
  static inline const char* name = "h2.coordinator";
};

using coordinator_self = caf::stateful_actor<coordinator_state>*;

/// How long a join nonce may be answered, and how many unanswered ones one
/// process may hold.
constexpr std::chrono::seconds join_nonce_lifetime{30};
constexpr std::size_t max_joins_per_process = 4;

/// Ends the job everywhere with `code` and `why`.
void fail_job(coordinator_self self, errc code, const std::string& why) {
  auto& st = self->state;
  if (st.ended)
    return;
  st.ended = true;
  const auto code8 = static_cast<std::uint8_t>(code);
  for (auto& [rank, m] : st.members)
    self->send(m.node, abort_atom::value, code8, why,
               st.signer->seal(abort_order, abort_payload(code8, why)));
  if (st.options.run.admin)
    st.options.run.admin->close();
  if (st.scheduler)
    self->send_exit(st.scheduler, caf::exit_reason::user_shutdown);
  self->send(st.waiter, done_atom::value, make_error(code, why),
             runtime::run_summary{}, std::vector<runtime::parameter_values>{});
  self->quit();
}

void finish_job(coordinator_self self, const runtime::run_summary& summary,
                std::vector<runtime::parameter_values> params) {
  auto& st = self->state;
  if (st.ended)
    return;
  st.ended = true;
  for (auto& [rank, m] : st.members)
    self->send(m.node, finish_atom::value, st.signer->seal(finish_order, ""));
  if (st.options.run.admin)
    st.options.run.admin->close();
  if (st.scheduler)
    self->send_exit(st.scheduler, caf::exit_reason::user_shutdown);
  self->send(st.waiter, done_atom::value, caf::error{}, summary,
             std::move(params));
  self->quit();
}

/// Collects replica 0's parameters chip by chip, then finishes.
void collect_parameters(
  coordinator_self self, const runtime::run_summary& summary, std::size_t next,
  std::shared_ptr<std::vector<runtime::parameter_values>> out) {
  auto& st = self->state;
  const auto chips = replica_chips(st.ctx->the_plan.replicas.front());
  if (next == chips.size()) {
    // Chip by chip is not layer order once a chip holds several chunks.
    std::stable_sort(
      out->begin(), out->end(),
      [](const auto& a, const auto& b) { return a.layer < b.layer; });
    finish_job(self, summary, std::move(*out));
    return;
  }
  self
    ->request(st.ctx->chips[next], step_timeout(*st.options.job),
              params_atom::value)
    .then(
      [self, summary, next, out](std::vector<runtime::parameter_values>& ps) {
        out->insert(out->end(), ps.begin(), ps.end());
        collect_parameters(self, summary, next + 1, out);
      },
      [self, next](caf::error& e) {
        auto& st = self->state;
        auto f = request_failure(
          e, *st.options.job,
          replica_chips(st.ctx->the_plan.replicas.front())[next]);
        fail_job(self, f.code, f.message);
      });
}

void train(coordinator_self self) {
  auto& st = self->state;
  std::vector<caf::actor> others;
  for (auto& [rank, m] : st.members)
    if (rank != st.options.rank)
      others.push_back(m.node);
  st.observer = std::make_unique<broadcast_observer>(st.options.observer,
                                                     std::move(others));
  st.ctx->observer = st.observer.get();
  st.ctx->stop = st.options.stop;
  st.ctx->admin = st.options.run.admin;
  st.scheduler = spawn_scheduler(self->system(), st.ctx);
  // The whole run has no deadline: each of its requests to a chip has one
  // (runtime.step_timeout_seconds), and the heartbeats end a run whose node
  // dies or stalls.
  self
    ->request(st.scheduler, caf::infinite, train_atom::value,
              st.options.run.steps)
    .then(
      [self](runtime::run_summary& s) {
        if (self->state.options.run.collect_parameters)
          collect_parameters(
            self, s, 0,
            std::make_shared<std::vector<runtime::parameter_values>>());
        else
          finish_job(self, s, {});
      },
      [self](caf::error& e) {
        auto f = to_failure(e);
        fail_job(self, f.code, f.message);
      });
}

/// Every node joined: plan, assign, wait until every node is ready, train.
void start_job(coordinator_self self) {
  auto& st = self->state;
  const job_config& job = *st.options.job;
  plan p;
  try {
    p = st.options.plan_override ? *st.options.plan_override
                                 : scheduler::make_plan(job);
    validate_plan(p, job, "plan");
    check_replans(st.options.run.replans, p, job);
  } catch (const std::exception& e) {
    fail_job(self, errc::bad_config, e.what());
    return;
  }
  const std::string& forced = job.transport.backend;
  std::map<int, node_assignment> assignments;
  try {
    std::map<int, transport::endpoint_address> addresses;
    for (const auto& [rank, m] : st.members)
      addresses[rank] = m.info.address;
    for (auto& [rank, links] : runtime::assign_links(
           p, addresses, forced, job.model.tie_embeddings)) {
      if (st.options.log)
        for (const auto& l : links)
          if (l.dial) { // once per channel between nodes
            const auto path = runtime::device_path(
              *job.find_chip(l.peer), *job.find_chip(l.local), l.backend,
              job.transport.cuda_ipc);
            st.options.log("channel " + l.peer.to_string() + " <-> " +
                           l.local.to_string() + ": " + l.backend +
                           (forced == "auto" ? "" : " (forced)") +
                           (path.empty() ? "" : ", " + path));
          }
      assignments[rank].links = std::move(links);
    }
  } catch (const std::exception& e) {
    fail_job(self, errc::bad_config, e.what());
    return;
  }
  const auto origin = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  st.ctx = std::make_shared<run_context>();
  st.ctx->job = st.options.job;
  st.ctx->the_plan = p;
  st.ctx->replans = st.options.run.replans;
  std::string marker;
  const auto& resume = st.options.run.resume;
  if (resume)
    st.ctx->first_step = static_cast<int>(resume->manifest.step);
  if (st.writer) {
    try {
      marker = runtime::write_checkpoint_marker(job.checkpoint.dir);
      st.ctx->manifest =
        runtime::job_manifest(job, p, st.options.run.job_text);
      if (resume) // the same job goes on
        st.ctx->manifest.job_id = resume->manifest.job_id;
    } catch (const std::exception& e) {
      fail_job(self, errc::checkpoint, e.what());
      return;
    }
    st.ctx->checkpoints = st.writer;
  }
  auto pending = std::make_shared<std::size_t>(st.members.size());
  auto actors = std::make_shared<std::map<chip_id, caf::actor>>();
  for (auto& [rank, m] : st.members) {
    auto& a = assignments[rank];
    a.plan_json = to_json(p, -1);
    a.origin_system_ns = origin;
    a.checkpoint_marker = marker;
    if (resume) {
      a.resume_dir = resume->dir.string();
      a.resume_step = resume->manifest.step;
    }
    a.seal = st.signer->seal(assign_order, assignment_payload(a));
    self->request(m.node, std::chrono::minutes(5), assign_atom::value, a)
      .then(
        [self, pending, actors](node_ready& r) {
          for (std::size_t i = 0; i < r.chips.size(); ++i)
            (*actors)[r.chips[i]] = r.actors[i];
          if (--*pending != 0)
            return;
          auto& st = self->state;
          for (const auto& chip : plan_chips(st.ctx->the_plan))
            st.ctx->chips.push_back(actors->at(chip));
          train(self);
        },
        [self, rank = rank](caf::error& e) {
          auto f = to_failure(e);
          fail_job(self, f.code,
                   "node " + std::to_string(rank) + ": " + f.message);
        });
  }
}

/// A node's hello: a fresh nonce for its join proof, unless its rank is
/// not the job's or joined already.
caf::result<std::string> on_hello(coordinator_self self, std::int32_t rank) {
  auto& st = self->state;
  const auto& nodes = st.options.job->nodes;
  if (std::none_of(nodes.begin(), nodes.end(),
                   [rank](const node_spec& n) { return n.rank == rank; }))
    return make_error(errc::bad_config, "node rank " + std::to_string(rank) +
                                          " is not one of the job's " +
                                          std::to_string(nodes.size()) +
                                          " nodes");
  if (st.members.count(rank) != 0 || st.proven.count(rank) != 0)
    return make_error(errc::bad_config,
                      "node " + std::to_string(rank) + " joined twice");
  // Nonces expire, and each process may hold only a few: a flood of
  // hellos from one connection evicts only its own.
  const auto now = std::chrono::steady_clock::now();
  const auto from = self->current_sender() != nullptr
                      ? self->current_sender()->node()
                      : caf::node_id{};
  std::erase_if(st.nonces,
                [&](const auto& n) { return n.second.expires <= now; });
  std::vector<decltype(st.nonces)::iterator> own;
  for (auto n = st.nonces.begin(); n != st.nonces.end(); ++n)
    if (n->second.from == from)
      own.push_back(n);
  if (own.size() >= max_joins_per_process)
    st.nonces.erase(*std::min_element(
      own.begin(), own.end(), [](const auto& a, const auto& b) {
        return a->second.expires < b->second.expires;
      }));
  auto nonce = transport::make_nonce();
  st.nonces[nonce] = {rank, from, now + join_nonce_lifetime};
  return nonce;
}

/// A node's join: proves the secret with the nonce handed to its rank and
/// names the same job file; only then may it attach.
caf::result<bool> on_join(coordinator_self self, const node_join& j) {
  auto& st = self->state;
  auto nonce = st.nonces.find(j.nonce);
  if (nonce == st.nonces.end() || nonce->second.rank != j.rank ||
      nonce->second.expires <= std::chrono::steady_clock::now() ||
      !transport::join_proof_valid(*st.options.secret, j.nonce, j.rank,
                                   j.proof))
    // Nothing of the job reaches a node that cannot prove the secret.
    return make_error(errc::unauthorized, "node " + std::to_string(j.rank) +
                                            " does not know the job's secret");
  st.nonces.erase(nonce);
  if (j.job_digest != st.options.job_digest)
    return make_error(errc::bad_config, "node " + std::to_string(j.rank) +
                                          " (" + j.hostname +
                                          ") runs another job file");
  if (st.ended || st.members.count(j.rank) != 0 || st.proven.count(j.rank) != 0)
    return make_error(errc::bad_config,
                      "node " + std::to_string(j.rank) + " cannot join");
  st.proven[j.rank] = j;
  return true;
}

/// A node attaches its node actor under its seal, after its join; the
/// job starts once every node has.
caf::result<bool> on_attach(coordinator_self self,
                            const transport::control_seal& seal,
                            const caf::actor& node) {
  auto& st = self->state;
  auto proven = st.proven.find(seal.sender);
  if (proven == st.proven.end() || !node ||
      !st.verifier->accept(node_attach, seal, "")) {
    st.drops.dropped(st.options.log,
                     "a node attach without a join or a valid seal");
    return make_error(errc::unauthorized,
                      "node " + std::to_string(seal.sender) +
                        ": an attach without a join or a valid seal");
  }
  const int rank = seal.sender;
  if (st.ended)
    return make_error(errc::bad_config,
                      "node " + std::to_string(rank) + " cannot join");
  self->monitor(node);
  const node_join& j = proven->second;
  if (st.options.log)
    st.options.log("node " + std::to_string(rank) + " joined (" + j.hostname +
                   ", pid " + std::to_string(j.pid) +
                   "): " + std::to_string(st.members.size() + 1) + " of " +
                   std::to_string(st.options.world_size) + " nodes");
  st.members[rank] = {node, j, std::chrono::steady_clock::now()};
  st.proven.erase(proven);
  if (static_cast<int>(st.members.size()) == st.options.world_size)
    start_job(self);
  return true;
}

/// The heartbeat timer: beats to every other node, ends the job when a
/// node stalled or never joined, and comes again.
void on_check(coordinator_self self) {
  auto& st = self->state;
  if (st.ended)
    return;
  auto now = std::chrono::steady_clock::now();
  for (auto& [rank, m] : st.members)
    if (rank != st.options.rank)
      self->send(m.node, heartbeat_atom::value,
                 st.signer->seal(coordinator_heartbeat, ""));
  for (auto& [rank, m] : st.members)
    if (now - m.seen > heartbeat_timeout) {
      fail_job(self, errc::peer_lost,
               "node " + std::to_string(rank) + " (" +
                 chips_of(*st.options.job, rank) +
                 ") stalled: no heartbeat for " +
                 std::to_string(heartbeat_timeout.count()) + " s");
      return;
    }
  // A node that never joins must not keep the others waiting: the job
  // ends, naming it, and the nodes that joined end with it.
  if (static_cast<int>(st.members.size()) < st.options.world_size &&
      now >= st.join_deadline) {
    std::vector<int> ranks, joined;
    for (const auto& n : st.options.job->nodes)
      ranks.push_back(n.rank);
    for (const auto& [rank, m] : st.members)
      joined.push_back(rank);
    fail_job(self, errc::peer_lost,
             never_joined(ranks, joined, st.options.join_timeout));
    return;
  }
  self->delayed_send(self, heartbeat_interval, check_atom::value);
}

caf::behavior
coordinator_actor(coordinator_self self, node_options options,
                  caf::actor waiter,
                  std::shared_ptr<runtime::checkpoint_writer> writer) {
  self->state.options = std::move(options);
  self->state.waiter = std::move(waiter);
  self->state.writer = std::move(writer);
  self->state.join_deadline =
    std::chrono::steady_clock::now() + self->state.options.join_timeout;
  self->state.signer = std::make_unique<transport::control_signer>(
    self->state.options.secret, self->state.options.rank);
  self->state.verifier = std::make_unique<transport::control_verifier>(
    self->state.options.secret);
  // Whatever else reaches the coordinator's port is dropped and logged.
  self->set_default_handler(
    [self](caf::scheduled_actor*,
           caf::message_view&) -> caf::result<caf::message> {
      auto& st = self->state;
      st.drops.dropped(st.options.log,
                       "an unexpected message at the coordinator");
      return caf::sec::unexpected_message;
    });
  self->set_down_handler([self](caf::down_msg& m) {
    for (auto& [rank, mem] : self->state.members)
      if (m.source == mem.node.address()) {
        fail_job(self, errc::peer_lost,
                 "node " + std::to_string(rank) + " (" +
                   chips_of(*self->state.options.job, rank) +
                   ") is gone: its process ended or its connection broke");
        return;
      }
  });
  self->delayed_send(self, heartbeat_interval, check_atom::value);
  return {
    [self](hello_atom, std::int32_t rank) -> caf::result<std::string> {
      return on_hello(self, rank);
    },
    // The join proves the secret; only then does the node spawn its node
    // actor and attach it under its seal, so a refused node never hands
    // out an actor of its own.
    [self](join_atom, const node_join& j) -> caf::result<bool> {
      return on_join(self, j);
    },
    [self](attach_atom, const transport::control_seal& seal,
           const caf::actor& node) -> caf::result<bool> {
      return on_attach(self, seal, node);
    },
    // A node that proved the secret but cannot train (its [ditorch] check
    // failed) says why instead of attaching: the job ends naming it.
    [self](withdraw_atom, const std::string& why,
           const transport::control_seal& seal) -> caf::result<bool> {
      auto& st = self->state;
      const int rank = seal.sender;
      if (st.proven.count(rank) == 0 ||
          !st.verifier->accept(node_withdraw, seal, why)) {
        st.drops.dropped(st.options.log,
                         "a node withdrawal without a join or a valid seal");
        return make_error(errc::unauthorized,
                          "node " + std::to_string(rank) +
                            ": a withdrawal without a join or a valid seal");
      }
      st.proven.erase(rank);
      fail_job(self, errc::peer_lost,
               "node " + std::to_string(rank) + " (" +
                 chips_of(*st.options.job, rank) +
                 ") withdrew before training: " + why.substr(0, 512));
      return true;
    },
    [self](heartbeat_atom, const transport::control_seal& seal) {
      auto& st = self->state;
      if (!st.verifier->accept(node_heartbeat, seal, "")) {
        st.drops.dropped(st.options.log, "a heartbeat without a valid seal");
        return;
      }
      auto m = st.members.find(seal.sender);
      if (m != st.members.end())
        m->second.seen = std::chrono::steady_clock::now();
    },
    [self](stop_atom, const transport::control_seal& seal) {
      auto& st = self->state;
      if (!st.verifier->accept(stop_request, seal, "")) {
        st.drops.dropped(st.options.log, "a stop without a valid seal");
        return;
      }
      if (st.options.stop)
        st.options.stop->store(std::max(1, st.options.stop->load()));
    },
    [self](check_atom) { on_check(self); },
  };
}

} // namespace

caf::actor
spawn_coordinator(caf::actor_system& system, node_options options,
                  caf::actor waiter,
                  std::shared_ptr<runtime::checkpoint_writer> writer) {
  return system.spawn(coordinator_actor, std::move(options), std::move(waiter),
                      std::move(writer));
}

} // namespace h2::actors
