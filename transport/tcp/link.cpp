#include "link.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/endpoint.hpp"

#include <asio.hpp>

#include <cerrno>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

namespace h2::transport::tcp {

int listen_on(const std::string& host, std::uint16_t& port) {
  sockaddr_storage address = ip_address(host, 0);
  const std::string where =
    (address.ss_family == AF_INET6 ? "[" + host + "]" : host) + ":0";
  int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw bind_error("tcp", where, errno);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const socklen_t len =
    address.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), len) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    throw bind_error("tcp", where, err);
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  port = ntohs(bound.ss_family == AF_INET6
                 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                 : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return fd;
}

std::unique_ptr<socket_link> make_link(int fd, std::string peer) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::make_unique<socket_link>(fd, "tcp", std::move(peer));
}

std::unique_ptr<socket_link> dial(const std::string& host, std::uint16_t port,
                                  deadline until) {
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  asio::ip::tcp::resolver resolver(io);
  const std::string where = host + ":" + std::to_string(port);
  asio::error_code result = asio::error::would_block;
  resolver.async_resolve(
    host, std::to_string(port),
    [&](const asio::error_code& ec,
        asio::ip::tcp::resolver::results_type endpoints) {
      if (ec) {
        result = ec;
        return;
      }
      asio::async_connect(s, endpoints,
                          [&](const asio::error_code& e,
                              const asio::ip::tcp::endpoint&) { result = e; });
    });
  io.run_until(until);
  if (result == asio::error::would_block)
    throw transport_error(transport_errc::timeout,
                          "tcp: no connection to " + where + " in time");
  if (result)
    throw transport_error(transport_errc::peer_closed,
                          "tcp: cannot connect to " + where + ": " +
                            result.message());
  return make_link(s.release(), where);
}

} // namespace h2::transport::tcp
