// A job across several h2-node processes (one per node, on one host or
// many). The lowest rank (0) hosts the coordinator: nodes join it through
// CAF remote actors and prove they know the job's secret before anything
// else reaches them; it plans, tells every node its chips and channels
// (addresses exchanged through it), runs the scheduler actor over every
// node's chip actors, watches the nodes (CAF monitors and heartbeats), and
// ends the job everywhere when one fails.
#pragma once

#include "h2/actors/errors.hpp"
#include "h2/actors/local_job.hpp"
#include "h2/runtime/reports.hpp"
#include "h2/runtime/observer.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/transport/handshake.hpp"

#include <caf/actor.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace h2::actors {

struct node_options {
  std::shared_ptr<const job_config> job;
  std::string job_digest; ///< transport::job_digest of the job file's text
  int rank = 0;
  int world_size = 1; ///< the job's nodes (job->nodes: their ranks)
  /// The node that hosts the coordinator: the job's lowest rank (0 unless
  /// node 0 was excluded after it failed).
  int coordinator_rank = 0;
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
  runtime::training_observer* observer = nullptr;
  /// Non-zero: stop at the next step boundary (any rank may ask).
  std::shared_ptr<std::atomic<int>> stop;
  /// Rank 0: how long the coordinator waits, once it listens, for every
  /// node to join; past it the job fails (errc::peer_lost) naming the
  /// ranks that never came (never_joined). Other ranks: how long they try
  /// to reach the coordinator. cluster.join_timeout_seconds.
  std::chrono::milliseconds join_timeout{std::chrono::seconds(300)};
  /// Other ranks: set when this node cannot train (its chips failed the
  /// [ditorch] check). It joins only to tell the coordinator why, which
  /// ends the job naming it (errc::peer_lost on every other node); run()
  /// then throws run_error(errc::failed, *withdraw).
  std::optional<std::string> withdraw;
  /// Rank 0: called once the coordinator listens, with its port.
  std::function<void(std::uint16_t)> on_listening;
  /// Rank 0: called with one line per channel between nodes (which chips,
  /// which backend) once the job is planned. May be empty.
  std::function<void(const std::string&)> log;
};

/// "rank 2 of 3 never joined within 2 s", "ranks 2, 3 of 4 never joined
/// within 5 s": why a job whose nodes `ranks` did not all join within
/// `timeout` ends (`joined`: the ranks that did, in any order).
std::string never_joined(const std::vector<int>& ranks,
                         const std::vector<int>& joined,
                         std::chrono::milliseconds timeout);

/// How a node's run ended.
struct node_outcome {
  runtime::run_summary summary;                      ///< rank 0
  std::vector<runtime::parameter_values> parameters; ///< rank 0, when collected
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

private:
  node_options options_;
  std::shared_ptr<cancellation> cancel_ = std::make_shared<cancellation>();
  std::shared_ptr<struct node_shared> shared_;
};

} // namespace h2::actors
