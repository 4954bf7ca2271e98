// Backend `tcp`: everywhere. Sockets with TCP_NODELAY; frames are written
// with scatter-gather straight from the tensor and read straight into the
// receiver's tensor, so large messages are never copied twice
// (docs/transport.md).
#pragma once

#include "h2/transport/endpoint.hpp"

#include <memory>

namespace h2::transport::tcp {

/// Whether tcp joins `a` and `b`: both listen on a port. The last row of
/// choose_backend()'s table.
inline bool can_connect(const endpoint_address& a,
                        const endpoint_address& b) noexcept {
  return a.tcp_port != 0 && b.tcp_port != 0;
}

/// The tcp backend of an endpoint. Its start() throws config_error
/// (transport.bind) when options.bind_host is not an IP address and
/// bind_error when it cannot listen there.
std::unique_ptr<backend> make_backend(const endpoint_options& options);

} // namespace h2::transport::tcp
