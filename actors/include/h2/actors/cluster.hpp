// A job across several h2-node processes (one per node, on one host or
// many). Rank 0 hosts the coordinator: nodes join it through CAF remote
// actors and prove they know the job's secret before anything else reaches
// them; it plans, tells every node its chips and channels (addresses
// exchanged through it), runs the scheduler actor over every node's chip
// actors, watches the nodes (CAF monitors and heartbeats), and ends the job
// everywhere when one fails.
#pragma once

#include "h2/actors/errors.hpp"
#include "h2/actors/local_job.hpp"
#include "h2/actors/messages.hpp"
#include "h2/actors/observer.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/transport/endpoint.hpp"

#include <caf/actor.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace h2::transport {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, endpoint_address& x) {
  return f(caf::meta::type_name("endpoint_address"), x.node_rank, x.host_id,
           x.tcp_host, x.tcp_port, x.shm_socket, x.rdma_device, x.rdma_port);
}

} // namespace h2::transport

namespace h2::actors {

/// A node asking to join: who it is, where its transport listens, and the
/// proof that it knows the job's secret.
struct node_join {
  std::int32_t rank = 0;
  std::string proof;      ///< hex HMAC of the coordinator's nonce
  std::string job_digest; ///< SHA-256 of the job, so all nodes run one job
  transport::endpoint_address address;
  std::int32_t pid = 0;
  std::string hostname;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_join& x) {
  return f(caf::meta::type_name("node_join"), x.rank, x.proof, x.job_digest,
           x.address, x.pid, x.hostname);
}

/// One channel a node must open: to `peer` from its chip `local`.
struct link_assignment {
  std::uint64_t id = 0;
  chip_id local;
  chip_id peer;
  transport::endpoint_address peer_address;
  bool dial = false;   ///< dial (else accept)
  std::string backend; ///< "inproc", "shm", "rdma", "tcp"
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, link_assignment& x) {
  return f(caf::meta::type_name("link_assignment"), x.id, x.local, x.peer,
           x.peer_address, x.dial, x.backend);
}

/// What a node runs: the plan and its channels.
struct node_assignment {
  std::string plan_json;
  std::vector<link_assignment> links;
  /// The run's clock origin, nanoseconds of the system clock since its
  /// epoch (every node maps it onto its own steady clock).
  std::int64_t origin_system_ns = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_assignment& x) {
  return f(caf::meta::type_name("node_assignment"), x.plan_json, x.links,
           x.origin_system_ns);
}

/// A node's chip actors, ready.
struct node_ready {
  std::int32_t rank = 0;
  std::vector<chip_id> chips;
  std::vector<caf::actor> actors;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_ready& x) {
  return f(caf::meta::type_name("node_ready"), x.rank, x.chips, x.actors);
}

/// How often nodes report that they live, and how long the coordinator
/// waits before it declares a silent node stalled.
constexpr std::chrono::seconds heartbeat_interval{1};
constexpr std::chrono::seconds heartbeat_timeout{5};

struct node_options {
  std::shared_ptr<const job_config> job;
  std::string job_digest; ///< of the job file's text
  int rank = 0;
  int world_size = 1;
  /// The coordinator's address (rank 0 listens there; port 0: any).
  std::string coordinator_host = "127.0.0.1";
  std::uint16_t coordinator_port = 0;
  /// Where this node's transport listens (what peers dial).
  std::string bind_host = "127.0.0.1";
  std::shared_ptr<const transport::job_secret> secret;
  /// Rank 0: a plan to use instead of the job's [plan].
  std::optional<plan> plan_override;
  run_options run;
  /// Rank 0: progress, logs, metrics of the whole job. Other ranks: their
  /// chips' metrics (step summaries are broadcast). May be null.
  training_observer* observer = nullptr;
  /// Non-zero: stop at the next step boundary (any rank may ask).
  std::shared_ptr<std::atomic<int>> stop;
  /// How long to wait for the coordinator and for every node to join.
  std::chrono::seconds join_timeout{60};
  /// Rank 0: called once the coordinator listens, with its port.
  std::function<void(std::uint16_t)> on_listening;
  /// Rank 0: called with one line per channel between nodes (which chips,
  /// which backend) once the job is planned. May be empty.
  std::function<void(const std::string&)> log;
};

/// How a node's run ended.
struct node_outcome {
  run_summary summary;                      ///< rank 0
  std::vector<parameter_values> parameters; ///< rank 0, when collected
};

class cluster_node {
public:
  explicit cluster_node(node_options options);
  ~cluster_node();

  cluster_node(const cluster_node&) = delete;
  cluster_node& operator=(const cluster_node&) = delete;

  /// Joins the job, builds this node's chips and channels, trains (rank 0
  /// drives every node) and ends with the others. Blocks. Throws run_error:
  /// the root cause of a failure anywhere in the job (errc::peer_lost when
  /// a node died or stalled), or config_error for bad input.
  node_outcome run();

  /// Fails this node's work at once (a second signal). Thread-safe.
  void abort() noexcept;

  /// SHA-256 of a job file's text, hex (node_options::job_digest).
  static std::string digest(const std::string& job_text);

private:
  node_options options_;
  std::shared_ptr<cancellation> cancel_ = std::make_shared<cancellation>();
  std::shared_ptr<struct node_shared> shared_;
};

} // namespace h2::actors
