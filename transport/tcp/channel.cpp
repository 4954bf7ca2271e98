#include "h2/transport/tcp/channel.hpp"

#include "h2/transport/socket_link.hpp"

#include <asio.hpp>

#include <sys/socket.h>

namespace h2::transport::tcp {

namespace {

class tcp_backend final : public backend {
public:
  explicit tcp_backend(const endpoint_options& options)
    : bind_host_(options.bind_host) {}

  ~tcp_backend() override { stop(); }

  std::string_view name() const noexcept override { return "tcp"; }

  bool can_connect(const endpoint_address& a,
                   const endpoint_address& b) const override {
    return a.tcp_port != 0 && b.tcp_port != 0;
  }

  void start(endpoint_address& local,
             std::function<void(std::unique_ptr<byte_link>)> on_connection)
    override {
    asio::error_code ec;
    auto address = asio::ip::make_address(bind_host_, ec);
    if (ec)
      throw config_error("transport.bind", "\"" + bind_host_ +
                                             "\" is not an IP address");
    acceptor_.open(address.is_v6() ? asio::ip::tcp::v6() : asio::ip::tcp::v4());
    acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true));
    acceptor_.bind({address, 0}, ec);
    if (ec)
      throw transport_error(transport_errc::peer_closed,
                            "cannot listen on " + bind_host_ + ": " +
                              ec.message());
    acceptor_.listen(asio::socket_base::max_listen_connections);
    local.tcp_host = bind_host_;
    local.tcp_port = acceptor_.local_endpoint().port();
    thread_ = std::thread([this, cb = std::move(on_connection)] {
      for (;;) {
        asio::error_code e;
        asio::ip::tcp::socket s(io_);
        acceptor_.accept(s, e);
        if (stopped_.load())
          return;
        if (e)
          continue;
        s.set_option(asio::ip::tcp::no_delay(true), e);
        int fd = s.release();
        cb(std::make_unique<socket_link>(fd, "tcp", describe_peer(fd)));
      }
    });
  }

  std::unique_ptr<byte_link> connect(const endpoint_address& peer,
                                     deadline until) override {
    asio::io_context io;
    asio::ip::tcp::socket s(io);
    asio::ip::tcp::resolver resolver(io);
    std::string where = peer.tcp_host + ":" + std::to_string(peer.tcp_port);
    asio::error_code result = asio::error::would_block;
    resolver.async_resolve(
      peer.tcp_host, std::to_string(peer.tcp_port),
      [&](const asio::error_code& ec,
          asio::ip::tcp::resolver::results_type endpoints) {
        if (ec) {
          result = ec;
          return;
        }
        asio::async_connect(s, endpoints,
                            [&](const asio::error_code& e,
                                const asio::ip::tcp::endpoint&) {
                              result = e;
                            });
      });
    io.run_until(until);
    if (result == asio::error::would_block)
      throw transport_error(transport_errc::timeout,
                            "tcp: no connection to " + where + " in time");
    if (result)
      throw transport_error(transport_errc::peer_closed,
                            "tcp: cannot connect to " + where + ": " +
                              result.message());
    s.set_option(asio::ip::tcp::no_delay(true));
    int fd = s.release();
    return std::make_unique<socket_link>(fd, "tcp", where);
  }

  std::unique_ptr<byte_link> upgrade(std::unique_ptr<byte_link> bootstrap,
                                     bool, deadline) override {
    return bootstrap; // data travels on the bootstrap connection itself
  }

  void stop() noexcept override {
    if (stopped_.exchange(true))
      return;
    // Wakes the blocking accept().
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
    if (thread_.joinable())
      thread_.join();
    asio::error_code ec;
    acceptor_.close(ec);
  }

private:
  std::string bind_host_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_{io_};
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

} // namespace

std::unique_ptr<backend> make_backend(const endpoint_options& options) {
  return std::make_unique<tcp_backend>(options);
}

} // namespace h2::transport::tcp
