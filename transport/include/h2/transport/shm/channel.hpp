// Backend `shm`: between nodes of one host (DESIGN.md's host identity).
// Peers meet on an abstract Unix socket (handshake there), then the acceptor
// creates an anonymous shared-memory segment (memfd) holding, per
// direction, a ring for frames and a heap for large tensors, and passes it
// over the socket. A tensor of 64 KiB or more is copied once, into a heap
// block that the receiver adopts as its tensor; other payloads (and tensors
// when the heap is full) stream through the ring into the receiver's
// buffer. Receives poll the ring themselves, then sleep on a futex. The
// segment has no name: the kernel frees it when both processes and every
// received tensor are gone, however they end (SIGKILL included), so
// nothing can leak.
#pragma once

#include "h2/transport/endpoint.hpp"

namespace h2::transport::shm {

/// The shm backend of an endpoint.
std::unique_ptr<backend> make_backend(const endpoint_options& options);

} // namespace h2::transport::shm
