#include "h2/actors/cluster.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/actors/chip_actor.hpp"
#include "h2/actors/scheduler_actor.hpp"
#include "h2/actors/stage_worker.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "h2/transport/inproc/channel.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <map>
#include <thread>
#include <unistd.h>

namespace h2::actors {

namespace {

std::string hex(const unsigned char* data, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(digits[data[i] >> 4]);
    out.push_back(digits[data[i] & 15]);
  }
  return out;
}

std::string join_proof(const transport::job_secret& secret,
                       const std::string& nonce, int rank) {
  auto p = secret.prove("join/" + nonce + "/" + std::to_string(rank));
  return hex(p.data(), p.size());
}

/// Chips of node `rank`, for messages.
std::string chips_of(const job_config& job, int rank) {
  std::string out;
  for (const auto* c : job.chips())
    if (c->id.node == rank)
      out += (out.empty() ? "" : ", ") + c->id.to_string();
  return out.empty() ? "no chips" : "chips " + out;
}

} // namespace

/// What a node's main thread and its actors share.
struct node_shared {
  std::shared_ptr<cancellation> cancel;
  std::unique_ptr<transport::endpoint> endpoint;
  std::mutex mutex;
  std::vector<std::shared_ptr<transport::channel>> channels;

  void keep(std::shared_ptr<transport::channel> ch) {
    std::lock_guard<std::mutex> guard(mutex);
    channels.push_back(std::move(ch));
  }

  /// Ends this node's work: waits end, channels close, no more accepts.
  void close_all() noexcept {
    cancel->cancel();
    std::lock_guard<std::mutex> guard(mutex);
    for (auto& ch : channels)
      ch->close();
    if (endpoint)
      endpoint->stop();
  }
};

namespace {

// -- the node actor
// ------------------------------------------------------------

struct node_context {
  std::shared_ptr<const job_config> job;
  int rank = 0;
  std::shared_ptr<node_shared> shared;
  caf::actor coordinator;
  caf::actor waiter; ///< the node's main thread
  training_observer* observer = nullptr;
  std::string forced_backend;
};

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
  std::vector<worker_setup> mine;
  for (auto& w : make_worker_setups(ctx.job, p, origin, ctx.shared->cancel))
    if (w.assignment.chip.node == ctx.rank)
      mine.push_back(std::move(w));
  auto setup_of = [&](const chip_id& c) -> worker_setup& {
    for (auto& w : mine)
      if (w.assignment.chip == c)
        return w;
    throw internal_error("node " + std::to_string(ctx.rank) + " has no chip " +
                         c.to_string());
  };
  auto attach = [&](const chip_id& local, const chip_id& peer,
                    std::shared_ptr<transport::channel> ch) {
    auto& link = setup_of(local).peers.at(peer);
    link.channel = ch;
    link.profile = job.find_chip(peer)->profile;
    ctx.shared->keep(std::move(ch));
  };
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  // Dials first, accepts after: accepts only pick up connections that the
  // endpoint's listeners took while this actor was dialing.
  for (int pass = 0; pass < 3; ++pass)
    for (const auto& l : a.links) {
      if (l.backend == "inproc") {
        if (pass != 0)
          continue;
        auto [x, y] = transport::inproc::make_pair();
        attach(l.local, l.peer, std::move(x));
        attach(l.peer, l.local, std::move(y));
      } else if (pass == 1 && l.dial) {
        attach(
          l.local, l.peer,
          ctx.shared->endpoint->dial(l.peer_address, l.id, l.backend, until));
      } else if (pass == 2 && !l.dial) {
        attach(l.local, l.peer, ctx.shared->endpoint->accept(l.id, until));
      }
    }
  node_ready ready;
  ready.rank = ctx.rank;
  for (auto& w : mine) {
    ready.chips.push_back(w.assignment.chip);
    auto chip = self->system().spawn<caf::detached>(chip_actor, std::move(w));
    ready.actors.push_back(chip);
    out.push_back(chip);
  }
  return ready;
}

struct node_state {
  node_context ctx;
  std::vector<caf::actor> chips;
  bool done = false;
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
  self->send(st.ctx.waiter, done_atom::value, err, run_summary{},
             std::vector<parameter_values>{});
  self->quit();
}

caf::behavior node_actor(node_self self, node_context ctx) {
  self->state.ctx = std::move(ctx);
  self->set_down_handler([self](caf::down_msg& m) {
    if (m.source == self->state.ctx.coordinator.address())
      end_node(self, make_error(errc::peer_lost,
                                "lost the coordinator (node 0): its process "
                                "ended or its connection broke"));
  });
  return {
    [self](assign_atom, const node_assignment& a) -> caf::result<node_ready> {
      self->monitor(self->state.ctx.coordinator);
      if (self->state.ctx.rank != 0) {
        self->state.coordinator_seen = std::chrono::steady_clock::now();
        self->delayed_send(self, heartbeat_interval, check_atom::value);
      }
      try {
        return build_node(self, self->state.ctx, a, self->state.chips);
      } catch (...) {
        self->state.ctx.shared->close_all();
        return current_exception_error();
      }
    },
    [self](heartbeat_atom, std::int32_t) {
      self->state.coordinator_seen = std::chrono::steady_clock::now();
    },
    [self](check_atom) {
      if (self->state.done)
        return;
      if (std::chrono::steady_clock::now() - self->state.coordinator_seen >
          heartbeat_timeout) {
        end_node(self, make_error(errc::peer_lost,
                                  "the coordinator (node 0, " +
                                    chips_of(*self->state.ctx.job, 0) +
                                    ") stalled: no heartbeat for " +
                                    std::to_string(heartbeat_timeout.count()) +
                                    " s"));
        return;
      }
      self->delayed_send(self, heartbeat_interval, check_atom::value);
    },
    [self](summary_atom, const step_summary& s) {
      if (self->state.ctx.observer != nullptr)
        self->state.ctx.observer->on_step(s);
    },
    [self](finish_atom) { end_node(self, caf::error{}); },
    [self](abort_atom, std::uint8_t code, const std::string& why) {
      end_node(self, make_error(static_cast<errc>(code), why));
    },
  };
}

// -- the coordinator
// -------------------------------------------------------------

/// Passes steps to rank 0's observer and broadcasts them (without their op
/// records) to the other nodes for their metrics.
class broadcast_observer final : public training_observer {
public:
  broadcast_observer(training_observer* local, std::vector<caf::actor> nodes)
      : local_(local), nodes_(std::move(nodes)) {}

  void on_setup(const plan& p, const std::vector<setup_report>& c) override {
    if (local_ != nullptr)
      local_->on_setup(p, c);
  }

  void on_step(const step_summary& s) override {
    if (local_ != nullptr)
      local_->on_step(s);
    step_summary slim = s;
    slim.ops.clear();
    for (const auto& n : nodes_)
      caf::anon_send(n, summary_atom::value, slim);
  }

  void on_eval(int step, double loss) override {
    if (local_ != nullptr)
      local_->on_eval(step, loss);
  }

private:
  training_observer* local_;
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
  std::map<int, std::string> nonces;
  std::map<int, member> members;
  std::shared_ptr<run_context> ctx;
  std::unique_ptr<broadcast_observer> observer;
  caf::actor scheduler;
  bool ended = false;
  static inline const char* name = "h2.coordinator";
};

using coordinator_self = caf::stateful_actor<coordinator_state>*;

/// Ends the job everywhere with `code` and `why`.
void fail_job(coordinator_self self, errc code, const std::string& why) {
  auto& st = self->state;
  if (st.ended)
    return;
  st.ended = true;
  for (auto& [rank, m] : st.members)
    self->send(m.node, abort_atom::value, static_cast<std::uint8_t>(code), why);
  if (st.scheduler)
    self->send_exit(st.scheduler, caf::exit_reason::user_shutdown);
  self->send(st.waiter, done_atom::value, make_error(code, why), run_summary{},
             std::vector<parameter_values>{});
  self->quit();
}

void finish_job(coordinator_self self, const run_summary& summary,
                std::vector<parameter_values> params) {
  auto& st = self->state;
  if (st.ended)
    return;
  st.ended = true;
  for (auto& [rank, m] : st.members)
    self->send(m.node, finish_atom::value);
  if (st.scheduler)
    self->send_exit(st.scheduler, caf::exit_reason::user_shutdown);
  self->send(st.waiter, done_atom::value, caf::error{}, summary,
             std::move(params));
  self->quit();
}

/// Collects replica 0's parameters chip by chip, then finishes.
void collect_parameters(coordinator_self self, const run_summary& summary,
                        std::size_t next,
                        std::shared_ptr<std::vector<parameter_values>> out) {
  auto& st = self->state;
  const auto stages = st.ctx->the_plan.replicas.front().stages.size();
  if (next == stages) {
    finish_job(self, summary, std::move(*out));
    return;
  }
  self->request(st.ctx->chips[next], caf::infinite, params_atom::value)
    .then(
      [self, summary, next, out](std::vector<parameter_values>& ps) {
        out->insert(out->end(), ps.begin(), ps.end());
        collect_parameters(self, summary, next + 1, out);
      },
      [self](caf::error& e) {
        auto f = to_failure(e);
        fail_job(self, f.code, f.message);
      });
}

void train(coordinator_self self) {
  auto& st = self->state;
  std::vector<caf::actor> others;
  for (auto& [rank, m] : st.members)
    if (rank != 0)
      others.push_back(m.node);
  st.observer = std::make_unique<broadcast_observer>(st.options.observer,
                                                     std::move(others));
  st.ctx->observer = st.observer.get();
  st.ctx->stop = st.options.stop;
  st.scheduler = spawn_scheduler(self->system(), st.ctx);
  self
    ->request(st.scheduler, caf::infinite, train_atom::value,
              st.options.run.steps)
    .then(
      [self](run_summary& s) {
        if (self->state.options.run.collect_parameters)
          collect_parameters(self, s, 0,
                             std::make_shared<std::vector<parameter_values>>());
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
  } catch (const std::exception& e) {
    fail_job(self, errc::bad_config, e.what());
    return;
  }
  std::string forced = job.transport.backend;
  if (const char* env = std::getenv("H2_TRANSPORT"); env != nullptr && *env)
    forced = env;
  std::map<int, node_assignment> assignments;
  try {
    std::uint64_t id = 0;
    for (const auto& l : plan_links(p)) {
      ++id;
      const auto& ma = st.members.at(l.a.node);
      const auto& mb = st.members.at(l.b.node);
      if (l.a.node == l.b.node) {
        assignments[l.a.node].links.push_back(
          {id, l.a, l.b, ma.info.address, false, "inproc"});
        continue;
      }
      auto backend =
        transport::choose_backend(ma.info.address, mb.info.address,
                                  transport::available_backends(), forced);
      if (st.options.log)
        st.options.log("channel " + l.a.to_string() + " <-> " +
                       l.b.to_string() + ": " + backend +
                       (forced.empty() || forced == "auto" ? "" : " (forced)"));
      assignments[l.a.node].links.push_back(
        {id, l.a, l.b, mb.info.address, false, backend});
      assignments[l.b.node].links.push_back(
        {id, l.b, l.a, ma.info.address, true, backend});
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
  auto pending = std::make_shared<std::size_t>(st.members.size());
  auto actors = std::make_shared<std::map<chip_id, caf::actor>>();
  for (auto& [rank, m] : st.members) {
    auto& a = assignments[rank];
    a.plan_json = to_json(p, -1);
    a.origin_system_ns = origin;
    self->request(m.node, std::chrono::minutes(5), assign_atom::value, a)
      .then(
        [self, pending, actors](node_ready& r) {
          for (std::size_t i = 0; i < r.chips.size(); ++i)
            (*actors)[r.chips[i]] = r.actors[i];
          if (--*pending != 0)
            return;
          auto& st = self->state;
          for (const auto& rep : st.ctx->the_plan.replicas)
            for (const auto& s : rep.stages)
              st.ctx->chips.push_back(actors->at(s.chip));
          train(self);
        },
        [self, rank = rank](caf::error& e) {
          auto f = to_failure(e);
          fail_job(self, f.code,
                   "node " + std::to_string(rank) + ": " + f.message);
        });
  }
}

caf::behavior coordinator_actor(coordinator_self self, node_options options,
                                caf::actor waiter) {
  self->state.options = std::move(options);
  self->state.waiter = std::move(waiter);
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
      auto& st = self->state;
      if (rank < 0 || rank >= st.options.world_size)
        return make_error(errc::bad_config,
                          "node rank " + std::to_string(rank) +
                            " is outside the job's " +
                            std::to_string(st.options.world_size) + " nodes");
      if (st.members.count(rank) != 0)
        return make_error(errc::bad_config,
                          "node " + std::to_string(rank) + " joined twice");
      unsigned char n[32];
      RAND_bytes(n, sizeof(n));
      return st.nonces[rank] = hex(n, sizeof(n));
    },
    [self](join_atom, const node_join& j,
           const caf::actor& node) -> caf::result<bool> {
      auto& st = self->state;
      auto nonce = st.nonces.find(j.rank);
      if (nonce == st.nonces.end() ||
          j.proof != join_proof(*st.options.secret, nonce->second, j.rank))
        // Nothing of the job reaches a node that cannot prove the secret.
        return make_error(errc::unauthorized,
                          "node " + std::to_string(j.rank) +
                            " does not know the job's secret");
      st.nonces.erase(nonce);
      if (j.job_digest != st.options.job_digest)
        return make_error(errc::bad_config, "node " + std::to_string(j.rank) +
                                              " (" + j.hostname +
                                              ") runs another job file");
      if (st.ended || st.members.count(j.rank) != 0)
        return make_error(errc::bad_config,
                          "node " + std::to_string(j.rank) + " cannot join");
      self->monitor(node);
      st.members[j.rank] = {node, j, std::chrono::steady_clock::now()};
      if (static_cast<int>(st.members.size()) == st.options.world_size)
        start_job(self);
      return true;
    },
    [self](heartbeat_atom, std::int32_t rank) {
      auto m = self->state.members.find(rank);
      if (m != self->state.members.end())
        m->second.seen = std::chrono::steady_clock::now();
    },
    [self](stop_atom) {
      if (self->state.options.stop)
        self->state.options.stop->store(
          std::max(1, self->state.options.stop->load()));
    },
    [self](check_atom) {
      auto& st = self->state;
      if (st.ended)
        return;
      auto now = std::chrono::steady_clock::now();
      for (auto& [rank, m] : st.members)
        if (rank != 0)
          self->send(m.node, heartbeat_atom::value, std::int32_t{0});
      for (auto& [rank, m] : st.members)
        if (now - m.seen > heartbeat_timeout) {
          fail_job(self, errc::peer_lost,
                   "node " + std::to_string(rank) + " (" +
                     chips_of(*st.options.job, rank) +
                     ") stalled: no heartbeat for " +
                     std::to_string(heartbeat_timeout.count()) + " s");
          return;
        }
      self->delayed_send(self, heartbeat_interval, check_atom::value);
    },
  };
}

void register_cluster_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<transport::endpoint_address>("h2.endpoint_address");
  cfg.add_message_type<node_join>("h2.node_join");
  cfg.add_message_type<link_assignment>("h2.link_assignment");
  cfg.add_message_type<node_assignment>("h2.node_assignment");
  cfg.add_message_type<node_ready>("h2.node_ready");
  cfg.add_message_type<chip_step_stats>("h2.chip_step_stats");
  cfg.add_message_type<traced_op>("h2.traced_op");
  cfg.add_message_type<step_summary>("h2.step_summary");
}

} // namespace

// -- cluster_node
// ----------------------------------------------------------------

cluster_node::cluster_node(node_options options)
    : options_(std::move(options)), shared_(std::make_shared<node_shared>()) {
  shared_->cancel = cancel_;
}

cluster_node::~cluster_node() = default;

void cluster_node::abort() noexcept {
  shared_->close_all();
}

std::string cluster_node::digest(const std::string& job_text) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(job_text.data(), job_text.size(), out, &len, EVP_sha256(),
             nullptr);
  return hex(out, len);
}

node_outcome cluster_node::run() {
  const job_config& job = *options_.job;
  H2_ENFORCE(options_.secret != nullptr, "a node needs the job's secret");
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  register_cluster_types(cfg);
  cfg.load<caf::io::middleman>();
  caf::actor_system system{cfg};

  transport::endpoint_options eo;
  eo.node_rank = options_.rank;
  eo.bind_host = options_.bind_host;
  eo.secret = options_.secret;
  eo.framing.crc = job.transport.crc;
  eo.shm_ring_bytes = job.transport.shm_ring_bytes;
  eo.shm_heap_bytes = job.transport.shm_heap_bytes;
  eo.backends = transport::available_backends();
  shared_->endpoint = std::make_unique<transport::endpoint>(eo);

  caf::scoped_actor self{system};
  const std::string where =
    options_.coordinator_host + ":" + std::to_string(options_.coordinator_port);
  caf::actor coordinator;
  if (options_.rank == 0) {
    coordinator = system.spawn(coordinator_actor, options_, caf::actor{self});
    auto port =
      system.middleman().publish(coordinator, options_.coordinator_port,
                                 options_.coordinator_host.c_str(), true);
    if (!port) {
      self->send_exit(coordinator, caf::exit_reason::user_shutdown);
      throw config_error("--coordinator", "cannot listen on " + where + ": " +
                                            system.render(port.error()));
    }
    if (options_.on_listening)
      options_.on_listening(*port);
  } else {
    auto deadline = std::chrono::steady_clock::now() + options_.join_timeout;
    for (;;) {
      auto c = system.middleman().remote_actor(options_.coordinator_host,
                                               options_.coordinator_port);
      if (c) {
        coordinator = *c;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw run_error(
          {errc::peer_lost, "node " + std::to_string(options_.rank) +
                              ": cannot reach the coordinator at " + where +
                              " (" + system.render(c.error()) + ")"});
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  node_context nctx;
  nctx.job = options_.job;
  nctx.rank = options_.rank;
  nctx.shared = shared_;
  nctx.coordinator = coordinator;
  nctx.waiter = caf::actor{self};
  nctx.observer = options_.rank == 0 ? nullptr : options_.observer;
  auto node = system.spawn<caf::detached>(node_actor, nctx);

  // Join: prove the secret against a fresh nonce.
  std::optional<failure> refused;
  std::string nonce;
  self
    ->request(coordinator, std::chrono::seconds(30), hello_atom::value,
              static_cast<std::int32_t>(options_.rank))
    .receive([&](std::string& n) { nonce = std::move(n); },
             [&](caf::error& e) { refused = to_failure(e); });
  if (!refused) {
    node_join j;
    j.rank = options_.rank;
    j.proof = join_proof(*options_.secret, nonce, options_.rank);
    j.job_digest = options_.job_digest;
    j.address = shared_->endpoint->address();
    j.pid = static_cast<std::int32_t>(::getpid());
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    j.hostname = host;
    self
      ->request(coordinator, std::chrono::seconds(30), join_atom::value, j,
                node)
      .receive([](bool) {}, [&](caf::error& e) { refused = to_failure(e); });
  }
  if (refused) {
    self->send_exit(node, caf::exit_reason::user_shutdown);
    if (options_.rank == 0)
      self->send_exit(coordinator, caf::exit_reason::user_shutdown);
    shared_->close_all();
    throw run_error(*refused);
  }

  // Heartbeats (and stop requests) from a thread of their own: they must
  // flow while this node's actors block in their work.
  std::atomic<bool> beating{true};
  std::thread heart([&] {
    bool stop_sent = false;
    caf::scoped_actor beat{system};
    while (beating.load()) {
      beat->send(coordinator, heartbeat_atom::value,
                 static_cast<std::int32_t>(options_.rank));
      if (!stop_sent && options_.stop && options_.stop->load() != 0 &&
          options_.rank != 0) {
        beat->send(coordinator, stop_atom::value);
        stop_sent = true;
      }
      const auto tick = std::chrono::duration_cast<std::chrono::milliseconds>(
                          heartbeat_interval) /
                        10;
      for (int i = 0; i < 10 && beating.load(); ++i)
        std::this_thread::sleep_for(tick);
    }
  });

  // The end: from the node actor (every rank) and the coordinator (rank 0).
  node_outcome outcome;
  std::optional<failure> failed;
  int ends = options_.rank == 0 ? 2 : 1;
  for (int i = 0; i < ends; ++i)
    self->receive([&](done_atom, caf::error& e, run_summary& s,
                      std::vector<parameter_values>& params) {
      if (e) {
        if (!failed)
          failed = to_failure(e);
      } else if (!params.empty() || s.steps > 0) {
        outcome.summary = s;
        outcome.parameters = std::move(params);
      }
    });
  beating.store(false);
  heart.join();
  shared_->close_all();
  if (failed)
    throw run_error(*failed);
  return outcome;
}

} // namespace h2::actors
