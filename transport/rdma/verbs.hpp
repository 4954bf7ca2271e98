// The rdma backend's machinery: sizes and bounds of its rings and queues,
// owning handles for verbs and rdma_cm objects, the records both ends
// exchange on the bootstrap connection, and rdma_cm event waits
// (docs/transport.md, RDMA). Private to transport/rdma/.
#pragma once

#include "h2/transport/link.hpp"
#include "h2/transport/socket_link.hpp"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace h2::transport::rdma {

// -- sizes and bounds --

constexpr std::uint64_t min_ring_bytes = std::uint64_t{64} << 10;
/// Credits travel as 32-bit immediates: a ring holds at most 1 GiB.
constexpr std::uint64_t max_ring_bytes = std::uint64_t{1} << 30;
/// Largest single write; smaller writes let copying into the staging ring
/// overlap the transfer of what was copied before.
constexpr std::uint64_t max_write_bytes = std::uint64_t{1} << 20;
/// Notifying writes in flight per direction (each takes one of the peer's
/// posted receives until its bytes are returned).
constexpr std::uint32_t max_notifications = 128;
/// Receives posted: the peer's data notifications plus its credits, which
/// are bounded by our own notifications in flight (ring.hpp), plus slack.
constexpr std::uint32_t recv_depth = 2 * max_notifications + 16;
/// Sends: up to two writes per notification (a wrapped transfer), credits.
constexpr std::uint32_t send_depth = 3 * max_notifications + 16;
constexpr int cq_depth = static_cast<int>(recv_depth + send_depth + 64);

/// How long a sleeping side waits before it checks that its peer lives.
constexpr std::chrono::milliseconds liveness_interval{20};

/// "what: <errno text>".
std::string errno_text(const char* what);

/// A failure to set up a connection (local resources or the peer's):
/// transport_error(peer_closed) "rdma: what".
[[noreturn]] void fail_setup(const std::string& what);

// -- owning handles --

template <auto Destroy>
struct destroyer {
  template <class T>
  void operator()(T* p) const noexcept {
    (void)Destroy(p);
  }
};

using channel_ptr =
  std::unique_ptr<rdma_event_channel, destroyer<&rdma_destroy_event_channel>>;
using id_ptr = std::unique_ptr<rdma_cm_id, destroyer<&rdma_destroy_id>>;
using pd_ptr = std::unique_ptr<ibv_pd, destroyer<&ibv_dealloc_pd>>;
using comp_ptr =
  std::unique_ptr<ibv_comp_channel, destroyer<&ibv_destroy_comp_channel>>;
using cq_ptr = std::unique_ptr<ibv_cq, destroyer<&ibv_destroy_cq>>;
using mr_ptr = std::unique_ptr<ibv_mr, destroyer<&ibv_dereg_mr>>;

/// The queue pair rdma_cm created on an id; destroyed before the id.
struct qp_guard {
  rdma_cm_id* id = nullptr;
  qp_guard() = default;
  qp_guard(const qp_guard&) = delete;
  qp_guard& operator=(const qp_guard&) = delete;
  ~qp_guard() {
    if (id != nullptr && id->qp != nullptr)
      rdma_destroy_qp(id);
  }
};

/// Page-aligned anonymous memory (registered memory must not share pages
/// with the heap: a fork would copy-on-write them away from the device).
class region {
public:
  region() = default;
  /// Throws transport_error(peer_closed) when the memory cannot be mapped.
  explicit region(std::size_t bytes);
  region(region&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  region& operator=(region&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~region();

  char* data() const noexcept { return static_cast<char*>(data_); }
  std::size_t bytes() const noexcept { return bytes_; }

private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// An owned file descriptor.
class fd_guard {
public:
  explicit fd_guard(int fd = -1) : fd_(fd) {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard();
  int get() const noexcept { return fd_; }

private:
  int fd_;
};

/// Throws as fail_setup() when `fd` cannot be made non-blocking.
void set_nonblocking(int fd);

// -- records on the bootstrap connection --

constexpr std::uint32_t record_magic = 0x44523248; // "H2RD"
constexpr std::uint16_t record_version = 1;

/// `bytes` little-endian bytes of `v` into `out`.
void put(std::byte* out, std::uint64_t v, int bytes);

/// The `bytes` little-endian bytes at `in`.
std::uint64_t get(const std::byte* in, int bytes);

/// The acceptor's offer: connect to my rdma_cm port with this token.
struct offer {
  std::uint64_t token = 0;
  std::uint16_t cm_port = 0;
};
constexpr std::size_t offer_bytes = 16; // magic, version, port, token

/// Where a peer may write: its receive ring.
struct ring_info {
  std::uint64_t address = 0;
  std::uint32_t rkey = 0;
  std::uint64_t capacity = 0;
};
constexpr std::size_t ring_info_bytes = 32; // magic, version, 0, addr, rkey,
                                            // 0, capacity

/// The dialer's rdma_cm private data: the token.
constexpr std::size_t private_data_bytes = 16; // magic, 0, token

void send_offer(socket_link& s, const offer& o, deadline until);

/// Throws transport_error: corrupt_frame for no record, protocol_mismatch
/// for another version, timeout past `until`.
offer receive_offer(socket_link& s, deadline until);

void send_ring(socket_link& s, const ring_info& r, deadline until);

/// Throws as receive_offer(), and corrupt_frame for a ring outside
/// [min_ring_bytes, max_ring_bytes].
ring_info receive_ring(socket_link& s, deadline until);

/// A random token pairing a connection request with its upgrade. Throws
/// h2::random_error when the kernel's RNG fails.
std::uint64_t random_token();

// -- rdma_cm events --

/// Waits up to `until` for the next event of `channel` (non-blocking fd) and
/// acknowledges it; returns its type and status.
std::pair<rdma_cm_event_type, int> next_event(rdma_event_channel* channel,
                                              deadline until,
                                              const std::string& where);

/// next_event(), failing the setup unless it is `expected`.
void expect_event(rdma_event_channel* channel, rdma_cm_event_type expected,
                  deadline until, const std::string& where);

/// A new event channel; fails the setup when none can be made.
rdma_event_channel* new_event_channel();

} // namespace h2::transport::rdma
