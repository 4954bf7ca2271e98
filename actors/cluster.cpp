// A node of a multi-node job, from its main thread: starts the actor system
// and the transport endpoint, hosts the coordinator (rank 0) or reaches it,
// joins, sends heartbeats, and waits for the end (node side in
// node_actor.cpp, coordinator side in coordinator.cpp).
#include "caf_port.hpp"
#include "cluster_protocol.hpp"

#include "h2/actors/atoms.hpp"
#include "h2/transport/handshake.hpp"

#include <caf/io/middleman.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace h2::actors {

std::string chips_of(const job_config& job, int rank) {
  std::string out;
  for (const auto* c : job.chips())
    if (c->id.node == rank)
      out += (out.empty() ? "" : ", ") + c->id.to_string();
  return out.empty() ? "no chips" : "chips " + out;
}

namespace {

/// "2", "2.5", "300": a timeout's seconds, for messages.
std::string seconds_of(std::chrono::milliseconds timeout) {
  std::ostringstream out;
  out << std::chrono::duration<double>(timeout).count();
  return out.str();
}

} // namespace

std::string never_joined(const std::vector<int>& ranks,
                         const std::vector<int>& joined,
                         std::chrono::milliseconds timeout) {
  std::string missing;
  int count = 0;
  for (int r : ranks)
    if (std::find(joined.begin(), joined.end(), r) == joined.end()) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      ++count;
    }
  return (count == 1 ? "rank " : "ranks ") + missing + " of " +
         std::to_string(ranks.size()) + " never joined within " +
         seconds_of(timeout) + " s";
}

void register_cluster_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<transport::endpoint_address>("h2.endpoint_address");
  cfg.add_message_type<transport::control_seal>("h2.control_seal");
  cfg.add_message_type<node_join>("h2.node_join");
  cfg.add_message_type<runtime::link_assignment>("h2.link_assignment");
  cfg.add_message_type<node_assignment>("h2.node_assignment");
  cfg.add_message_type<node_ready>("h2.node_ready");
  cfg.add_message_type<runtime::chip_step_stats>("h2.chip_step_stats");
  cfg.add_message_type<runtime::traced_op>("h2.traced_op");
  cfg.add_message_type<runtime::step_summary>("h2.step_summary");
}

cluster_node::cluster_node(node_options options)
    : options_(std::move(options)), shared_(std::make_shared<node_shared>()) {
  shared_->cancel = cancel_;
}

cluster_node::~cluster_node() = default;

void cluster_node::abort() noexcept {
  shared_->close_all();
}

namespace {

/// Opens this node's transport endpoint (logging where its channels
/// listen), its progress watchdog and its checkpoint writer.
void open_node(const node_options& options, node_shared& shared) {
  const job_config& job = *options.job;
  transport::endpoint_options eo;
  eo.node_rank = options.rank;
  eo.bind_host = options.bind_host;
  eo.secret = options.secret;
  eo.framing.crc = job.transport.crc;
  eo.framing.send_timeout = std::chrono::milliseconds(
    static_cast<std::int64_t>(std::ceil(job.transport.timeout_seconds * 1000)));
  eo.shm_ring_bytes = job.transport.shm_ring_bytes;
  eo.shm_heap_bytes = job.transport.shm_heap_bytes;
  eo.rdma_ring_bytes = job.transport.rdma_ring_bytes;
  eo.backends = transport::available_backends();
  eo.log = options.log;
  shared.endpoint = std::make_unique<transport::endpoint>(eo);
  if (options.log) { // where an operator (or a flood) finds the channels
    const auto& a = shared.endpoint->address();
    std::string where;
    if (a.tcp_port != 0)
      where += "tcp " + a.tcp_host + ":" + std::to_string(a.tcp_port);
    if (!a.shm_socket.empty())
      where += (where.empty() ? "shm @" : ", shm @") + a.shm_socket;
    if (!a.rdma_device.empty())
      where += ", rdma " + a.rdma_device + ":" + std::to_string(a.rdma_port);
    options.log("node " + std::to_string(options.rank) + " (pid " +
                std::to_string(::getpid()) + "): channels listen on " + where);
  }
  shared.watchdog = std::make_shared<runtime::progress_watchdog>(job.watchdog);
  if (!job.checkpoint.dir.empty())
    shared.writer = std::make_shared<runtime::checkpoint_writer>(
      job.checkpoint.dir, job.checkpoint.keep);
}

std::string coordinator_address(const node_options& options) {
  return options.coordinator_host + ":" +
         std::to_string(options.coordinator_port);
}

/// The coordinator's rank: spawns the coordinator and publishes it on its
/// port (unpublished when `published` goes).
caf::actor lead(caf::actor_system& system, caf::scoped_actor& self,
                const node_options& options, node_shared& shared,
                guarded_port& published) {
  auto coordinator =
    spawn_coordinator(system, options, caf::actor{self}, shared.writer);
  try {
    published = publish_guarded(system, coordinator, options.coordinator_port,
                                options.coordinator_host, {});
  } catch (const error& e) {
    self->send_exit(coordinator, caf::exit_reason::user_shutdown);
    throw config_error("--coordinator", "cannot listen on " +
                                          coordinator_address(options) + ": " +
                                          e.what());
  }
  if (options.on_listening)
    options.on_listening(published.port());
  return coordinator;
}

/// Any other rank: connects to the coordinator until options.join_timeout,
/// telling a refused TLS identity (another secret) apart.
caf::actor reach_coordinator(caf::actor_system& system, const caf_tls& tls,
                             const node_options& options) {
  const std::string where = coordinator_address(options);
  auto deadline = std::chrono::steady_clock::now() + options.join_timeout;
  for (;;) {
    auto c = caf::openssl::remote_actor(system, options.coordinator_host,
                                        options.coordinator_port);
    if (c)
      return *c;
    // CAF's connect fails alike whatever went wrong: a TLS handshake of
    // our own tells a refused identity (another secret) apart. Only
    // after a failure: a probe that gets through reaches CAF's BASP
    // broker, and one closing mid-join now and then broke another
    // node's join (CAF 0.17).
    std::string why;
    if (tls.probe(options.coordinator_host, options.coordinator_port,
                  std::chrono::seconds(5),
                  why) == caf_tls::probe_result::refused)
      throw run_error({errc::unauthorized,
                       "node " + std::to_string(options.rank) +
                         ": the coordinator at " + where +
                         " refused this node's TLS identity (" + why +
                         "): this node does not know the job's secret, or the "
                         "coordinator does not"});
    if (std::chrono::steady_clock::now() >= deadline)
      throw run_error(
        {errc::peer_lost, "node " + std::to_string(options.rank) +
                            ": cannot reach the coordinator at " + where +
                            " within " + seconds_of(options.join_timeout) +
                            " s (" + system.render(c.error()) + ")"});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

/// What this node's actor needs of it.
node_context node_context_of(const node_options& options,
                             std::shared_ptr<node_shared> shared,
                             const caf::actor& coordinator,
                             caf::scoped_actor& self, bool leads) {
  node_context nctx;
  nctx.job = options.job;
  nctx.rank = options.rank;
  nctx.shared = std::move(shared);
  nctx.coordinator = coordinator;
  nctx.waiter = caf::actor{self};
  nctx.coordinator_rank = options.coordinator_rank;
  nctx.secret = options.secret;
  nctx.log = options.log;
  nctx.observer = leads ? nullptr : options.observer;
  return nctx;
}

/// The join of this node, or why it was refused: a hello for a nonce, the
/// proof of the secret against it, then (unless it withdraws) the node
/// actor attached under this node's seal, which `node` holds then.
std::optional<failure> join(caf::actor_system& system, caf::scoped_actor& self,
                            const caf::actor& coordinator,
                            const node_context& nctx,
                            const node_options& options,
                            transport::control_signer& signer,
                            caf::actor& node) {
  // The coordinator's own errors say why it refused; any other (no answer,
  // its process gone) is a coordinator this node cannot reach. The node
  // actor exists only once the proof is accepted: a detached actor spawned
  // and killed at once on a refusal now and then hung CAF 0.17's actor
  // system teardown (its detached thread waited for an actor nothing
  // released).
  std::optional<failure> refused;
  auto join_failed = [&](const caf::error& e) {
    refused = to_failure(e);
    if (e.category() != error_category)
      refused =
        failure{errc::peer_lost,
                "node " + std::to_string(options.rank) +
                  ": the coordinator at " + coordinator_address(options) +
                  " did not answer its join (" + refused->message + ")"};
  };
  std::string nonce;
  self
    ->request(coordinator, std::chrono::seconds(30), hello_atom::value,
              static_cast<std::int32_t>(options.rank))
    .receive([&](std::string& n) { nonce = std::move(n); },
             [&](caf::error& e) { join_failed(e); });
  if (!refused) {
    node_join j;
    j.rank = options.rank;
    j.nonce = nonce;
    j.proof = transport::join_proof(*options.secret, nonce, options.rank);
    j.job_digest = options.job_digest;
    j.address = nctx.shared->endpoint->address();
    j.pid = static_cast<std::int32_t>(::getpid());
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    j.hostname = host;
    self->request(coordinator, std::chrono::seconds(30), join_atom::value, j)
      .receive([](bool) {}, [&](caf::error& e) { join_failed(e); });
  }
  if (!refused && options.withdraw) {
    const std::string& why = *options.withdraw;
    self
      ->request(coordinator, std::chrono::seconds(30), withdraw_atom::value,
                why, signer.seal(node_withdraw, why))
      .receive([](bool) {}, [&](caf::error& e) { join_failed(e); });
    if (!refused)
      refused = failure{errc::failed, why};
  }
  if (!refused) {
    node = spawn_node_actor(system, nctx);
    self
      ->request(coordinator, std::chrono::seconds(30), attach_atom::value,
                signer.seal(node_attach, ""), node)
      .receive([](bool) {}, [&](caf::error& e) { join_failed(e); });
  }
  return refused;
}

/// Waits for the end, from the node actor (every rank) and the
/// coordinator (its rank): the run's outcome, or the first failure, which
/// ends this node's work at once (its node actor may be blocked wiring
/// channels to a node that already failed).
std::optional<failure> await_end(caf::scoped_actor& self, bool leads,
                                 node_shared& shared, node_outcome& outcome) {
  std::optional<failure> failed;
  const int ends = leads ? 2 : 1;
  for (int i = 0; i < ends; ++i)
    self->receive([&](done_atom, caf::error& e, runtime::run_summary& s,
                      std::vector<runtime::parameter_values>& params) {
      if (e) {
        if (!failed) {
          failed = to_failure(e);
          shared.close_all();
        }
      } else if (!params.empty() || s.steps > 0) {
        outcome.summary = s;
        outcome.parameters = std::move(params);
      }
    });
  return failed;
}

} // namespace

node_outcome cluster_node::run() {
  const job_config& job = *options_.job;
  H2_ENFORCE(options_.secret != nullptr, "a node needs the job's secret");
  H2_ENFORCE(!options_.withdraw || options_.rank != options_.coordinator_rank,
             "the coordinator's node cannot withdraw from its own job");
  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  register_cluster_types(cfg);
  cfg.load<caf::io::middleman>();
  // Mutual TLS between the nodes' actor systems, always (docs/transport.md,
  // "TLS"); `tls` outlives the system, which reads its files per connection.
  const caf_tls tls(job, *options_.secret);
  tls.configure(cfg);
  caf::actor_system system{cfg};
  if (options_.log)
    options_.log("node " + std::to_string(options_.rank) +
                 ": actor messages between nodes over TLS (" + tls.describe() +
                 ")");
  open_node(options_, *shared_);

  caf::scoped_actor self{system};
  guarded_port published; // unpublished before the system goes
  const bool leads = options_.rank == options_.coordinator_rank;
  const caf::actor coordinator =
    leads ? lead(system, self, options_, *shared_, published)
          : reach_coordinator(system, tls, options_);
  // Join: prove the secret against a fresh nonce, then attach the node
  // actor under this node's seal. `signer` seals what this node tells the
  // coordinator: its attach, heartbeats and stop request.
  transport::control_signer signer(options_.secret, options_.rank);
  caf::actor node;
  if (auto refused =
        join(system, self, coordinator,
             node_context_of(options_, shared_, coordinator, self, leads),
             options_, signer, node)) {
    if (node)
      self->send_exit(node, caf::exit_reason::user_shutdown);
    if (leads)
      self->send_exit(coordinator, caf::exit_reason::user_shutdown);
    shared_->close_all();
    throw run_error(*refused);
  }
  // Joined: from now on this node ends when the coordinator dies or falls
  // silent, also before the job starts (the coordinator still waits for
  // other nodes, plans, loads a checkpoint).
  self->send(node, joined_atom::value);

  // A stalled chip of this node fails the job: its op ends with
  // stalled_error, which the coordinator reports as the root cause; this
  // node's other waits end with the abort.
  runtime::watchdog_thread watchdog(
    shared_->watchdog, [this](const runtime::stall&) { shared_->close_all(); });

  // Heartbeats (and stop requests) from a thread of their own: they must
  // flow while this node's actors block in their work.
  std::atomic<bool> beating{true};
  std::thread heart([&] {
    bool stop_sent = false;
    caf::scoped_actor beat{system};
    while (beating.load()) {
      beat->send(coordinator, heartbeat_atom::value,
                 signer.seal(node_heartbeat, ""));
      if (!stop_sent && options_.stop && options_.stop->load() != 0 &&
          !leads) {
        beat->send(coordinator, stop_atom::value, signer.seal(stop_request, ""));
        stop_sent = true;
      }
      const auto tick = std::chrono::duration_cast<std::chrono::milliseconds>(
                          heartbeat_interval) /
                        10;
      for (int i = 0; i < 10 && beating.load(); ++i)
        std::this_thread::sleep_for(tick);
    }
  });

  node_outcome outcome;
  std::optional<failure> failed = await_end(self, leads, *shared_, outcome);
  beating.store(false);
  heart.join();
  shared_->close_all();
  if (shared_->writer)
    shared_->writer->close(); // before the actors its callbacks talk to go
  if (failed) {
    if (auto stalled = watchdog.stalled())
      failed = failure{errc::stalled, stalled->message()};
    throw run_error(*failed);
  }
  return outcome;
}

} // namespace h2::actors