// Backend `shm`: between nodes of one host (endpoint_address::host_id).
// Peers meet on an abstract Unix socket (handshake there), then the acceptor
// creates an anonymous shared-memory segment (memfd) holding, per
// direction, a ring for frames and a heap for large tensors, and passes it
// over the socket. A tensor of 64 KiB or more is copied once, into a heap
// block that the receiver adopts as its tensor; other payloads (and tensors
// when the heap is full) stream through the ring into the receiver's
// buffer. Receives poll the ring themselves, then sleep on a futex. The
// segment has no name: the kernel frees it when both processes and every
// received tensor are gone, however they end (SIGKILL included), so
// nothing can leak (docs/transport.md, shm).
#pragma once

#include "h2/transport/endpoint.hpp"

#include <memory>

namespace h2::transport::shm {

/// Whether shm joins `a` and `b`: both run it, on one host (same boot id and
/// network namespace). Row 1 of choose_backend()'s table.
inline bool can_connect(const endpoint_address& a,
                        const endpoint_address& b) noexcept {
  return !a.shm_socket.empty() && !b.shm_socket.empty() &&
         a.host_id == b.host_id;
}

/// The shm backend of an endpoint. Throws config_error
/// (transport.shm_ring_mb, transport.shm_heap_mb) for sizes it cannot hold;
/// its start() throws bind_error when it cannot listen.
std::unique_ptr<backend> make_backend(const endpoint_options& options);

} // namespace h2::transport::shm
