// Backend `shm`: between nodes of one host (DESIGN.md's host identity).
// Peers meet on an abstract Unix socket (handshake there), then the acceptor
// creates an anonymous shared-memory segment (memfd) holding one ring per
// direction and passes it over the socket. Writers copy into the ring and
// readers straight out of it into the receiver's tensor; a message larger
// than the ring streams through it. Waiting is spin-then-futex. The segment
// has no name: the kernel frees it when both processes are gone, however
// they end (SIGKILL included), so nothing can leak.
#pragma once

#include "h2/transport/endpoint.hpp"

namespace h2::transport::shm {

/// The shm backend of an endpoint.
std::unique_ptr<backend> make_backend(const endpoint_options& options);

} // namespace h2::transport::shm
