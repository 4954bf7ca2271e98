// Backend `rdma`: between nodes that both have an RDMA device (InfiniBand or
// RoCE, through rdma-core's verbs and rdma_cm; not iWARP, which has no
// immediate data; docs/transport.md, RDMA).
//
// Peers meet over a TCP connection of the backend's own (the handshake runs
// there, as for tcp; endpoint_address::rdma_port is its port, tcp_host its
// host), then upgrade() sets up one RC queue pair with rdma_cm: the acceptor
// sends a random token and its rdma_cm port over the bootstrap connection,
// the dialer resolves the bootstrap peer's address and connects carrying the
// token as private data, and the acceptor's rdma_cm listener pairs the
// request with the waiting upgrade by that token. Both ends then exchange
// their receive ring (address, rkey, capacity) over the bootstrap.
//
// Data moves by one-sided RDMA WRITE WITH IMMEDIATE from a registered
// staging ring into the peer's registered receive ring (the immediate says
// how many bytes landed); the reader copies out of its ring straight into
// the receiver's tensor and returns consumed bytes as credits (a zero-byte
// SEND WITH IMMEDIATE), so a writer never overruns the ring (ring.hpp).
// Memory is registered once per link. A send from CUDA device memory whose
// allocation exports as a dma-buf is written straight from the device
// (ibv_reg_dmabuf_mr, cached per allocation): the device-direct path.
//
// Waits spin, then block on the completion channel, and check every 20 ms
// that the bootstrap socket still has a peer: a dead or closed peer is
// peer_closed within that bound, a stalled one a timeout at the waiting
// call. Without a device (no hardware, or rdma-core answering ENOSYS /
// ENODEV as on machines without InfiniBand) start() leaves rdma_device
// empty and the endpoint chooses another backend; nothing fails.
#pragma once

#include "h2/transport/endpoint.hpp"

#include <memory>
#include <string>
#include <vector>

namespace h2::transport::rdma {

/// The RDMA devices of this host that have an active port, or why none.
struct device_probe {
  std::vector<std::string> devices; ///< device names, e.g. "mlx5_0"
  /// Why `devices` is empty, e.g. "ibv_get_device_list: Function not
  /// implemented"; empty otherwise.
  std::string why_none;
};

/// Whether rdma joins `a` and `b`: both found a device. Row 2 of
/// choose_backend()'s table; pure, so it is compiled (and the table the
/// same) also where rdma-core is not: no address then names a device.
inline bool can_connect(const endpoint_address& a,
                        const endpoint_address& b) noexcept {
  return !a.rdma_device.empty() && !b.rdma_device.empty();
}

// Defined only where rdma-core was found (H2_HAS_RDMA).

/// Looks for usable RDMA devices (opens each briefly). Never throws.
device_probe probe_devices() noexcept;

/// The rdma backend of an endpoint. Each direction's receive ring has
/// options.rdma_ring_bytes bytes; throws config_error
/// (transport.rdma_ring_mb) unless that is 64 KiB to 1 GiB.
std::unique_ptr<backend> make_backend(const endpoint_options& options);

} // namespace h2::transport::rdma
