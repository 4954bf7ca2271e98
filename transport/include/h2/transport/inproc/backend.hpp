// Backend `inproc`: both ends in one process (chips of one node). Messages
// are handed over without copying: a tensor sent is the tensor received.
// The loopback transport that always exists (as UCX's `self`), and row 0 of
// choose_backend()'s table (docs/transport.md, Which backend).
#pragma once

#include "h2/transport/channel.hpp"
#include "h2/transport/endpoint.hpp"

#include <memory>
#include <utility>

namespace h2::transport::inproc {

/// Whether inproc joins `a` and `b`: chips of one node, i.e. one process.
inline bool can_connect(const endpoint_address& a,
                        const endpoint_address& b) noexcept {
  return a.node_rank == b.node_rank;
}

/// Creates the two connected ends of an in-process channel. Either end may
/// be used and destroyed on any thread.
std::pair<std::unique_ptr<channel>, std::unique_ptr<channel>> make_pair();

} // namespace h2::transport::inproc
