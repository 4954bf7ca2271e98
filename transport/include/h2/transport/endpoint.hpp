// A node's transport endpoint: where its chips can be reached over every
// backend it runs, and how channels to other nodes are dialed and accepted.
// Backends are chosen in NCCL's manner: one ordered table, the first whose
// can_connect() joins the two addresses wins: inproc (same node), shm (same
// host), rdma (a device on both ends), tcp (docs/transport.md, Which
// backend). In-process pairs never reach an endpoint.
#pragma once

#include "h2/core/error.hpp"
#include "h2/transport/framed.hpp"
#include "h2/transport/handshake.hpp"
#include "h2/transport/link.hpp"
#include "h2/transport/report.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace h2::transport {

/// Where a node's transport can be reached; exchanged through the
/// coordinator (a plain struct so actors can send it).
struct endpoint_address {
  std::int32_t node_rank = 0;
  /// The host's identity: boot id + network namespace (docs/transport.md:
  /// one kernel and network namespace is one host).
  std::string host_id;
  std::string tcp_host; ///< address peers dial
  std::uint16_t tcp_port = 0;
  std::string shm_socket; ///< abstract Unix socket of the shm rendezvous
  std::string rdma_device; ///< "" when this node has no RDMA device
  std::uint16_t rdma_port = 0;
};

/// This process's host identity (see endpoint_address::host_id).
std::string this_host_id();

/// A listener could not bind its address (the tcp listener's host:port, the
/// shm rendezvous socket): an address that is not this host's, one in use,
/// or no file descriptors left. Not a transport_error: no channel or peer is
/// involved yet.
class bind_error : public error {
public:
  /// `address` as the message names it ("10.0.0.2:0", "unix:h2-shm-...");
  /// `sys_errno` the errno of the failing call.
  bind_error(std::string backend, std::string address, int sys_errno);

  const std::string& address() const noexcept { return address_; }
  int sys_errno() const noexcept { return sys_errno_; }

private:
  std::string address_;
  int sys_errno_;
};

/// One backend of an endpoint: bootstraps a connection and turns it into the
/// link data travels on. Every backend folder (tcp/, shm/, rdma/) provides
/// one through the same three steps; whether it can join two addresses is
/// the free function `<backend>::can_connect` of its backend.hpp, which
/// choose_backend() walks.
class backend {
public:
  virtual ~backend() = default;

  /// "shm", "rdma", "tcp".
  virtual std::string_view name() const noexcept = 0;

  /// Starts listening, fills its part of `local`, and hands every incoming
  /// bootstrap connection to `on_connection` (on a thread of its own).
  virtual void start(endpoint_address& local,
                     std::function<void(std::unique_ptr<byte_link>)>
                       on_connection) = 0;

  /// Opens a bootstrap connection to `peer`.
  virtual std::unique_ptr<byte_link> connect(const endpoint_address& peer,
                                             deadline until) = 0;

  /// After the handshake on `bootstrap`: the link data travels on (the
  /// bootstrap itself for tcp, a shared-memory ring for shm, queue pairs for
  /// rdma).
  virtual std::unique_ptr<byte_link>
  upgrade(std::unique_ptr<byte_link> bootstrap, bool acceptor,
          deadline until) = 0;

  /// Stops listening. Idempotent.
  virtual void stop() noexcept = 0;
};

struct endpoint_options {
  std::int32_t node_rank = 0;
  /// Where the tcp backend listens and what peers are told to dial.
  std::string bind_host = "127.0.0.1";
  std::shared_ptr<const job_secret> secret;
  framed_options framing;
  /// Backends to run ("shm", "rdma", "tcp"); the order of choose_backend()'s
  /// table decides between them, not this list's.
  std::vector<std::string> backends = {"shm", "rdma", "tcp"};
  /// Bytes of each direction's shared-memory ring (job key
  /// transport.shm_ring_mb); more than 0, at most 1 TiB.
  std::uint64_t shm_ring_bytes = std::uint64_t{16} << 20;
  /// Bytes of each direction's shared-memory heap, where tensors of 64 KiB
  /// and more are placed for the receiver to adopt (one copy); 0 streams
  /// every payload through the ring. Pages are touched only when used.
  std::uint64_t shm_heap_bytes = std::uint64_t{256} << 20;
  /// Bytes of each direction's RDMA receive ring, and of the writer's
  /// staging ring that mirrors it (job key transport.rdma_ring_mb); 64 KiB
  /// to 1 GiB (credits travel as 32-bit immediates), else the rdma backend
  /// throws config_error naming the key.
  std::uint64_t rdma_ring_bytes = std::uint64_t{16} << 20;
  /// How long a peer may take to complete the handshake (and, for shm and
  /// rdma, to set up its link).
  std::chrono::milliseconds handshake_timeout{10000};
  /// Most incoming connections in their handshake at once, each on a
  /// thread of its own. One more cuts off the oldest that has not proved
  /// the secret yet, so silent connections cannot hold every slot, and is
  /// accepted once that thread has ended; when all have proved it and none
  /// ends within a second, the newcomer is refused (docs/transport.md,
  /// Bounds).
  std::size_t max_pending_handshakes = 64;
  /// Where refused connections and failed accepts are reported, at most
  /// one line per 10 s each (listeners, handshakes). Empty: nowhere.
  log_sink log;
};

/// The backends between processes that this build can run, in the order of
/// choose_backend()'s table ("shm", "rdma" where rdma-core was found,
/// "tcp"): what an endpoint may start. inproc is not among them: it needs no
/// endpoint.
std::vector<std::string> available_backends();

/// Which backend joins `a` and `b`, by one fixed table walked in order, the
/// first whose can_connect() says yes winning (NCCL's transport table):
///   0. inproc: the same node_rank (one process), always, also when
///      `forced` names another backend: forcing applies only between nodes;
///   1. shm: the same host_id, both with a rendezvous socket;
///   2. rdma: both with an rdma_device;
///   3. tcp: both with a tcp_port.
/// Between nodes only rows named in `enabled` count. `forced` ("" or "auto":
/// none) names the one backend to use between nodes. Throws config_error
/// (key transport.backend) for an unknown `forced`, for a forced backend
/// that is not enabled or cannot join the two, and when no row joins them.
/// Pure: reads only the addresses.
std::string choose_backend(const endpoint_address& a,
                           const endpoint_address& b,
                           const std::vector<std::string>& enabled,
                           std::string_view forced);

class endpoint {
public:
  /// Starts every backend of `options`. Throws transport_error or
  /// config_error when a listener cannot start.
  explicit endpoint(endpoint_options options);
  ~endpoint();

  endpoint(const endpoint&) = delete;
  endpoint& operator=(const endpoint&) = delete;

  const endpoint_address& address() const noexcept { return address_; }

  /// Dials channel `id` to `peer` over `backend_name`, runs the handshake
  /// (protocol version, the job's secret) and returns the channel. Throws
  /// transport_error (timeout, unauthorized, protocol_mismatch, ...).
  std::unique_ptr<channel> dial(const endpoint_address& peer,
                                std::uint64_t id,
                                std::string_view backend_name, deadline until);

  /// Waits for channel `id` dialed by a peer (who passed the handshake).
  /// Throws transport_error(timeout) past `until`.
  std::unique_ptr<channel> accept(std::uint64_t id, deadline until);

  /// Incoming connections refused (wrong secret, wrong protocol, garbage,
  /// silent past handshake_timeout, cut off or turned away for
  /// max_pending_handshakes, no thread to run their handshake).
  std::uint64_t refused() const;

  /// Handshakes in progress now (at most max_pending_handshakes).
  std::size_t pending_handshakes() const;

  /// Stops listening and fails waiting accepts. Idempotent.
  void stop() noexcept;

private:
  /// One incoming connection in its handshake, on a thread of its own.
  struct handshake_slot {
    std::thread thread;
    byte_link* link = nullptr; ///< cut off by shutdown(); owned by thread
    bool proved = false;       ///< the peer proved the secret
    bool done = false;         ///< the thread touches nothing after this
  };

  backend& find(std::string_view name);
  void on_connection(backend& b, std::unique_ptr<byte_link> link);
  /// The thread of `slot`: handshake and upgrade of `link`.
  void run_handshake(backend& b, std::unique_ptr<byte_link> link,
                     handshake_slot& slot);
  /// Joins the threads of finished handshakes. Under mutex_.
  void reap_locked();
  /// Counts a refused connection and reports why.
  void refuse(const std::string& why);

  endpoint_options options_;
  endpoint_address address_;
  std::vector<std::unique_ptr<backend>> backends_;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::condition_variable handshake_done_; ///< a slot's thread finished
  std::map<std::uint64_t, std::unique_ptr<channel>> accepted_;
  std::uint64_t refused_ = 0;
  bool stopped_ = false;
  std::list<handshake_slot> handshakes_;
  throttled_report report_refusal_;
};

} // namespace h2::transport
