#include "h2/transport/tcp/backend.hpp"

#include "link.hpp"

namespace h2::transport::tcp {

namespace {

class tcp_backend final : public backend {
public:
  explicit tcp_backend(const endpoint_options& options)
      : bind_host_(options.bind_host), log_(options.log) {}

  ~tcp_backend() override { stop(); }

  std::string_view name() const noexcept override { return "tcp"; }

  void start(
    endpoint_address& local,
    std::function<void(std::unique_ptr<byte_link>)> on_connection) override {
    std::uint16_t port = 0;
    listener_ = std::make_unique<socket_listener>(listen_on(bind_host_, port));
    local.tcp_host = bind_host_;
    local.tcp_port = port;
    listener_->start([](int fd) { return make_link(fd, describe_peer(fd)); },
                     std::move(on_connection),
                     "tcp " + bind_host_ + ":" + std::to_string(port), log_);
  }

  std::unique_ptr<byte_link> connect(const endpoint_address& peer,
                                     deadline until) override {
    return dial(peer.tcp_host, peer.tcp_port, until);
  }

  std::unique_ptr<byte_link> upgrade(std::unique_ptr<byte_link> bootstrap, bool,
                                     deadline) override {
    return bootstrap; // data travels on the bootstrap connection itself
  }

  void stop() noexcept override {
    if (listener_)
      listener_->stop();
  }

private:
  std::string bind_host_;
  log_sink log_;
  std::unique_ptr<socket_listener> listener_;
};

} // namespace

std::unique_ptr<backend> make_backend(const endpoint_options& options) {
  return std::make_unique<tcp_backend>(options);
}

} // namespace h2::transport::tcp
