// What the two roles of a multi-node job say to each other (private to
// actors/): the node side (node_actor.cpp: joins, builds its chips and
// channels, follows the coordinator) and the coordinator side
// (coordinator.cpp, rank 0: admits nodes that prove the job's secret, plans,
// assigns channels, drives the scheduler actor, watches every node).
// cluster.cpp runs them from a node's main thread (docs/architecture.md).
#pragma once

#include "h2/actors/cluster.hpp"
#include "h2/actors/messages.hpp"
#include "h2/runtime/checkpointing.hpp"
#include "h2/runtime/links.hpp"
#include "h2/runtime/watchdog.hpp"
#include "h2/transport/endpoint.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace h2::actors {

/// A node asking to join: who it is, where its transport listens, and the
/// proof that it knows the job's secret (transport::join_proof of the
/// coordinator's nonce).
struct node_join {
  std::int32_t rank = 0;
  std::string nonce;      ///< the coordinator's answer to its hello
  std::string proof;      ///< hex HMAC of the coordinator's nonce
  std::string job_digest; ///< transport::job_digest of the job file
  transport::endpoint_address address;
  std::int32_t pid = 0;
  std::string hostname;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_join& x) {
  return f(caf::meta::type_name("node_join"), x.rank, x.nonce, x.proof,
           x.job_digest, x.address, x.pid, x.hostname);
}

/// What a node runs: the plan and its channels.
struct node_assignment {
  std::string plan_json;
  std::vector<runtime::link_assignment> links;
  /// The run's clock origin, nanoseconds of the system clock since its
  /// epoch (every node maps it onto its own steady clock).
  std::int64_t origin_system_ns = 0;
  /// With [checkpoint]: what rank 0 wrote into checkpoint.dir's marker
  /// file; every node must read the same (runtime::check_checkpoint_marker).
  std::string checkpoint_marker;
  /// A resumed run: the checkpoint every node loads its chips' layers from,
  /// and its step (checked against its manifest). Empty: from scratch.
  std::string resume_dir;
  std::int64_t resume_step = 0;
  /// The coordinator's seal over all of the above (assignment_payload).
  transport::control_seal seal;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_assignment& x) {
  return f(caf::meta::type_name("node_assignment"), x.plan_json, x.links,
           x.origin_system_ns, x.checkpoint_marker, x.resume_dir, x.resume_step,
           x.seal);
}

/// What an assignment's seal covers: every field but the seal, each
/// length-prefixed so that no two assignments read alike.
inline std::string assignment_payload(const node_assignment& a) {
  std::string out;
  auto put = [&out](const auto& value) {
    std::string text;
    if constexpr (std::is_convertible_v<decltype(value), std::string_view>)
      text = std::string(value);
    else
      text = std::to_string(value);
    out += std::to_string(text.size()) + ":" + text;
  };
  put(a.plan_json);
  put(a.origin_system_ns);
  put(a.checkpoint_marker);
  put(a.resume_dir);
  put(a.resume_step);
  for (const auto& l : a.links) {
    put(l.id);
    put(l.local.to_string());
    put(l.peer.to_string());
    const auto& p = l.peer_address;
    put(p.node_rank);
    put(p.host_id);
    put(p.tcp_host);
    put(p.tcp_port);
    put(p.shm_socket);
    put(p.rdma_device);
    put(p.rdma_port);
    put(static_cast<int>(l.dial));
    put(l.backend);
  }
  return out;
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

/// The types of sealed control messages (transport::control_seal, docs/
/// transport.md, "Control messages"): a message whose seal does not verify
/// under the job's secret, or repeats a sequence number, is dropped and
/// logged. Node to coordinator: the attach of its node actor after its
/// join, or instead its withdrawal (payload: why), its heartbeat, a stop
/// request. Coordinator to node: the plan assignment (payload
/// assignment_payload), its heartbeat, abort (payload "<code>/<why>"),
/// finish.
inline constexpr std::string_view node_attach = "node-attach";
inline constexpr std::string_view node_withdraw = "node-withdraw";
inline constexpr std::string_view node_heartbeat = "node-heartbeat";
inline constexpr std::string_view stop_request = "stop";
inline constexpr std::string_view coordinator_heartbeat =
  "coordinator-heartbeat";
inline constexpr std::string_view assign_order = "assign";
inline constexpr std::string_view abort_order = "abort";
inline constexpr std::string_view finish_order = "finish";

/// The payload an abort's seal covers.
inline std::string abort_payload(std::uint8_t code, const std::string& why) {
  return std::to_string(code) + "/" + why;
}

/// Logs dropped control messages through `log` (may be empty): the 1st,
/// 2nd, 4th, 8th... so that a flood cannot flood the log.
class drop_log {
public:
  void dropped(const std::function<void(const std::string&)>& log,
               const std::string& what) {
    ++count_;
    if (log && (count_ & (count_ - 1)) == 0)
      log("dropped " + what + " (" + std::to_string(count_) +
          " control message" + (count_ == 1 ? "" : "s") +
          " dropped so far)");
  }

private:
  std::uint64_t count_ = 0;
};

/// How often nodes report that they live, and how long a silent node (or
/// coordinator) may stay silent before it is declared stalled.
constexpr std::chrono::seconds heartbeat_interval{1};
constexpr std::chrono::seconds heartbeat_timeout{5};

/// Registers the cluster's message types (on top of configure_actor_system).
void register_cluster_types(caf::actor_system_config& cfg);

/// "chips 1:0, 1:1" (or "no chips"): the chips of node `rank`, for messages.
std::string chips_of(const job_config& job, int rank);

/// What a node's main thread and its actors share.
struct node_shared {
  std::shared_ptr<cancellation> cancel;
  std::unique_ptr<transport::endpoint> endpoint;
  /// This node's checkpoint writer (the job's [checkpoint]); null: none.
  std::shared_ptr<runtime::checkpoint_writer> writer;
  /// Watches this node's chips (runtime/watchdog.hpp).
  std::shared_ptr<runtime::progress_watchdog> watchdog;
  std::mutex mutex;
  std::vector<std::shared_ptr<transport::channel>> channels;

  void keep(std::shared_ptr<transport::channel> ch) {
    std::lock_guard<std::mutex> guard(mutex);
    channels.push_back(std::move(ch));
  }

  /// Ends this node's work: waits end, channels close, no more accepts, a
  /// checkpoint being written is abandoned (the previous one stays the
  /// latest).
  void close_all() noexcept {
    cancel->cancel();
    if (writer)
      writer->abandon();
    std::lock_guard<std::mutex> guard(mutex);
    for (auto& ch : channels)
      ch->close();
    if (endpoint)
      endpoint->stop();
  }
};

/// The node side: what the node actor of every rank needs.
struct node_context {
  std::shared_ptr<const job_config> job;
  int rank = 0;
  int coordinator_rank = 0;
  std::shared_ptr<const transport::job_secret> secret;
  std::function<void(const std::string&)> log; ///< dropped messages; may be empty
  std::shared_ptr<node_shared> shared;
  caf::actor coordinator;
  caf::actor waiter; ///< the node's main thread
  runtime::training_observer* observer = nullptr;
};

/// Spawns the node actor (detached: it blocks while wiring channels). It
/// answers (assign_atom, node_assignment) with node_ready, takes the
/// coordinator's sealed heartbeats, finish and abort, and summaries, and tells
/// `ctx.waiter` (done_atom, error, run_summary, parameters) at its end.
caf::actor spawn_node_actor(caf::actor_system& system, node_context ctx);

/// Spawns the coordinator (rank 0). It answers hello (a nonce) and join
/// (admission), starts the job once every rank joined, and tells `waiter`
/// (done_atom, error, run_summary, parameters) at the job's end. `writer`
/// (rank 0's, null without [checkpoint]) publishes the checkpoints.
caf::actor
spawn_coordinator(caf::actor_system& system, node_options options,
                  caf::actor waiter,
                  std::shared_ptr<runtime::checkpoint_writer> writer);

} // namespace h2::actors
