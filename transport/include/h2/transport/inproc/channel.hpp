// Backend `inproc`: both ends in one process (chips of one node). Messages
// are handed over without copying: a tensor sent is the tensor received.
// The loopback transport that always exists (as UCX's `self`).
#pragma once

#include "h2/transport/channel.hpp"

#include <memory>
#include <utility>

namespace h2::transport::inproc {

/// Creates the two connected ends of an in-process channel.
std::pair<std::unique_ptr<channel>, std::unique_ptr<channel>> make_pair();

} // namespace h2::transport::inproc
