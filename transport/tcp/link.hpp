// The tcp backend's link: a socket_link over a TCP connection, and how one
// is listened for and dialed (docs/transport.md, File layout). Private to
// transport/tcp/ (rdma bootstraps through the tcp backend, not these).
#pragma once

#include "h2/transport/socket_link.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace h2::transport::tcp {

/// A socket bound to `host` on a free port and listening; `port` receives
/// the port. Throws config_error (transport.bind) when `host` is no IP
/// address, bind_error naming host:port and the errno text when the socket
/// cannot be made, bound or put to listen.
int listen_on(const std::string& host, std::uint16_t& port);

/// The link over connected TCP socket `fd` (owned from now on), with
/// TCP_NODELAY set: frames leave as soon as they are written.
std::unique_ptr<socket_link> make_link(int fd, std::string peer);

/// Connects to `host`:`port` (a name is resolved). Throws transport_error:
/// timeout when not connected by `until`, peer_closed when refused or
/// unreachable.
std::unique_ptr<socket_link> dial(const std::string& host, std::uint16_t port,
                                  deadline until);

} // namespace h2::transport::tcp
