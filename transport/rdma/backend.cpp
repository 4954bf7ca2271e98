#include "h2/transport/rdma/backend.hpp"

#include "link.hpp"
#include "verbs.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/socket_link.hpp"
#include "h2/transport/tcp/backend.hpp"
#include "h2/transport/wake_fd.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace h2::transport::rdma {

namespace {

constexpr int resolve_timeout_ms = 2000;

class rdma_backend final : public backend {
public:
  explicit rdma_backend(const endpoint_options& options)
      : node_rank_(options.node_rank),
        bind_host_(options.bind_host),
        ring_bytes_(options.rdma_ring_bytes),
        bootstrap_(tcp::make_backend(options)) {
    if (ring_bytes_ < min_ring_bytes || ring_bytes_ > max_ring_bytes)
      throw config_error("transport.rdma_ring_mb",
                         "the rdma ring must hold 64 KiB to 1 GiB (credits "
                         "travel as 32-bit immediates), not " +
                           std::to_string(ring_bytes_) + " bytes");
  }

  ~rdma_backend() override { stop(); }

  std::string_view name() const noexcept override { return "rdma"; }

  void start(
    endpoint_address& local,
    std::function<void(std::unique_ptr<byte_link>)> on_connection) override {
    auto probe = probe_devices();
    if (probe.devices.empty()) {
      why_unavailable_ = probe.why_none;
      return; // rdma_device stays empty: peers choose another backend
    }
    std::string device;
    try {
      device = listen(probe.devices.front());
    } catch (const transport_error& e) {
      why_unavailable_ = e.what();
      listen_id_.reset();
      listen_channel_.reset();
      return;
    }
    endpoint_address bootstrap;
    bootstrap_->start(bootstrap, std::move(on_connection));
    local.rdma_device = device;
    local.rdma_port = bootstrap.tcp_port;
    if (local.tcp_host.empty())
      local.tcp_host = bootstrap.tcp_host;
    listener_ = std::thread([this] { listen_loop(); });
  }

  std::unique_ptr<byte_link> connect(const endpoint_address& peer,
                                     deadline until) override {
    if (!listen_id_)
      throw config_error("transport.backend",
                         "node " + std::to_string(node_rank_) +
                           " has no RDMA device (" + why_unavailable_ + ")");
    endpoint_address bootstrap;
    bootstrap.tcp_host = peer.tcp_host;
    bootstrap.tcp_port = peer.rdma_port;
    try {
      return bootstrap_->connect(bootstrap, until);
    } catch (const transport_error& e) {
      throw transport_error(e.code(),
                            std::string("rdma bootstrap: ") + e.what());
    }
  }

  std::unique_ptr<byte_link> upgrade(std::unique_ptr<byte_link> bootstrap,
                                     bool acceptor, deadline until) override {
    auto* raw = dynamic_cast<socket_link*>(bootstrap.get());
    H2_ENFORCE(raw != nullptr, "the rdma bootstrap link is not a socket");
    bootstrap.release();
    std::unique_ptr<socket_link> socket(raw);
    return acceptor ? accept_link(std::move(socket), until)
                    : dial_link(std::move(socket), until);
  }

  void stop() noexcept override {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (stopped_)
        return;
      stopped_ = true;
    }
    arrived_.notify_all();
    bootstrap_->stop();
    if (listener_.joinable()) {
      wake(stop_.get());
      listener_.join();
    }
    listen_id_.reset();
    listen_channel_.reset();
  }

private:
  /// A dialer's connection request that an accepting upgrade waits for.
  struct slot {
    channel_ptr channel;
    id_ptr id;
  };

  /// Starts the rdma_cm listener on the bind address; returns the name of
  /// the device it is bound to (`fallback` for a wildcard or loopback bind,
  /// which accepts on whichever device a request arrives).
  std::string listen(const std::string& fallback) {
    listen_channel_.reset(new_event_channel());
    set_nonblocking(listen_channel_->fd);
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(listen_channel_.get(), &id, nullptr, RDMA_PS_TCP) != 0)
      fail_setup(errno_text("rdma_create_id"));
    listen_id_.reset(id);
    auto addr = ip_address(bind_host_, 0);
    if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&addr)) != 0)
      fail_setup("cannot bind to " + bind_host_ + ": " +
                 errno_text("rdma_bind_addr"));
    if (rdma_listen(id, 128) != 0)
      fail_setup(errno_text("rdma_listen"));
    cm_port_ = ntohs(rdma_get_src_port(id));
    if (stop_.get() < 0)
      fail_setup(errno_text("eventfd"));
    if (id->verbs != nullptr)
      return ibv_get_device_name(id->verbs->device);
    return fallback;
  }

  /// Pairs incoming connection requests with waiting upgrades by token.
  void listen_loop() {
    for (;;) {
      pollfd fds[2] = {{listen_channel_->fd, POLLIN, 0},
                       {stop_.get(), POLLIN, 0}};
      ::poll(fds, 2, -1);
      {
        std::lock_guard<std::mutex> guard(mutex_);
        if (stopped_)
          return;
      }
      rdma_cm_event* ev = nullptr;
      while (rdma_get_cm_event(listen_channel_.get(), &ev) == 0) {
        if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
          // Events of requests not yet moved to their link's channel (a
          // dialer that gave up): their upgrade times out on its own.
          rdma_ack_cm_event(ev);
          continue;
        }
        std::optional<std::uint64_t> token;
        const auto* pd =
          static_cast<const std::byte*>(ev->param.conn.private_data);
        if (pd != nullptr &&
            ev->param.conn.private_data_len >= private_data_bytes &&
            get(pd, 4) == record_magic)
          token = get(pd + 8, 8);
        id_ptr id(ev->id);
        rdma_ack_cm_event(ev); // before migrating: it waits for acks
        hand_over(token, std::move(id));
      }
    }
  }

  void hand_over(std::optional<std::uint64_t> token, id_ptr id) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = token ? slots_.find(*token) : slots_.end();
    if (it == slots_.end() || it->second.id) {
      rdma_reject(id.get(), nullptr, 0); // unknown, late or repeated
      return;
    }
    // The link gets a channel of its own, so it outlives this listener.
    rdma_event_channel* ch = rdma_create_event_channel();
    if (ch == nullptr) {
      rdma_reject(id.get(), nullptr, 0);
      return;
    }
    channel_ptr channel(ch);
    const int flags = ::fcntl(ch->fd, F_GETFL, 0);
    if (rdma_migrate_id(id.get(), ch) != 0 || flags < 0 ||
        ::fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
      rdma_reject(id.get(), nullptr, 0);
      return;
    }
    it->second.channel = std::move(channel);
    it->second.id = std::move(id);
    arrived_.notify_all();
  }

  std::unique_ptr<byte_link> accept_link(std::unique_ptr<socket_link> socket,
                                         deadline until) {
    const std::uint64_t token = random_token();
    slot mine;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      slots_[token];
    }
    try {
      send_offer(*socket, {token, cm_port_}, until);
      std::unique_lock<std::mutex> lock(mutex_);
      for (;;) {
        auto& s = slots_[token];
        if (s.id) {
          mine = std::move(s);
          break;
        }
        if (stopped_)
          throw transport_error(transport_errc::cancelled,
                                "rdma: the endpoint was stopped");
        if (std::chrono::steady_clock::now() >= until)
          throw transport_error(transport_errc::timeout,
                                "rdma: peer " + socket->peer() +
                                  " did not connect its queue pair in time");
        arrived_.wait_for(lock, liveness_interval);
        if (socket->peer_gone())
          throw transport_error(transport_errc::peer_closed,
                                "rdma: peer " + socket->peer() +
                                  " left before connecting its queue pair");
      }
      slots_.erase(token);
    } catch (...) {
      std::lock_guard<std::mutex> guard(mutex_);
      slots_.erase(token);
      throw;
    }
    auto link =
      std::make_unique<rdma_link>(std::move(mine.channel), std::move(mine.id),
                                  std::move(socket), ring_bytes_);
    rdma_conn_param param{};
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.rnr_retry_count = 7; // our accounting avoids RNR; never fatal
    if (rdma_accept(link->id(), &param) != 0)
      fail_setup(errno_text("rdma_accept"));
    expect_event(link->channel(), RDMA_CM_EVENT_ESTABLISHED, until,
                 "accepting " + link->peer());
    link->exchange_rings(until);
    return link;
  }

  std::unique_ptr<byte_link> dial_link(std::unique_ptr<socket_link> socket,
                                       deadline until) {
    const offer o = receive_offer(*socket, until);
    // The acceptor's rdma_cm listens where its bootstrap socket was reached.
    sockaddr_storage dst{};
    socklen_t len = sizeof(dst);
    if (::getpeername(socket->fd(), reinterpret_cast<sockaddr*>(&dst), &len) !=
        0)
      fail_setup(errno_text("getpeername"));
    if (dst.ss_family == AF_INET)
      reinterpret_cast<sockaddr_in*>(&dst)->sin_port = htons(o.cm_port);
    else if (dst.ss_family == AF_INET6)
      reinterpret_cast<sockaddr_in6*>(&dst)->sin6_port = htons(o.cm_port);
    else
      fail_setup("the bootstrap connection is not over IP");
    const std::string where = "connecting to " + socket->peer();
    channel_ptr channel(new_event_channel());
    set_nonblocking(channel->fd);
    rdma_cm_id* raw = nullptr;
    if (rdma_create_id(channel.get(), &raw, nullptr, RDMA_PS_TCP) != 0)
      fail_setup(errno_text("rdma_create_id"));
    id_ptr id(raw);
    auto budget = [&] {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
      return static_cast<int>(
        std::clamp<long long>(left.count(), 1, resolve_timeout_ms));
    };
    if (rdma_resolve_addr(raw, nullptr, reinterpret_cast<sockaddr*>(&dst),
                          budget()) != 0)
      fail_setup(where + ": " + errno_text("rdma_resolve_addr"));
    expect_event(channel.get(), RDMA_CM_EVENT_ADDR_RESOLVED, until, where);
    if (rdma_resolve_route(raw, budget()) != 0)
      fail_setup(where + ": " + errno_text("rdma_resolve_route"));
    expect_event(channel.get(), RDMA_CM_EVENT_ROUTE_RESOLVED, until, where);
    auto link = std::make_unique<rdma_link>(std::move(channel), std::move(id),
                                            std::move(socket), ring_bytes_);
    std::byte private_data[private_data_bytes] = {};
    put(private_data, record_magic, 4);
    put(private_data + 8, o.token, 8);
    rdma_conn_param param{};
    param.private_data = private_data;
    param.private_data_len = sizeof(private_data);
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    if (rdma_connect(link->id(), &param) != 0)
      fail_setup(where + ": " + errno_text("rdma_connect"));
    expect_event(link->channel(), RDMA_CM_EVENT_ESTABLISHED, until, where);
    link->exchange_rings(until);
    return link;
  }

  std::int32_t node_rank_;
  std::string bind_host_;
  std::uint64_t ring_bytes_;
  /// The bootstrap listener and dialer: the tcp backend's, reused.
  std::unique_ptr<backend> bootstrap_;
  std::string why_unavailable_ = "not started";
  channel_ptr listen_channel_;
  id_ptr listen_id_;
  std::uint16_t cm_port_ = 0;
  fd_guard stop_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::thread listener_;

  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::uint64_t, slot> slots_; ///< by token
  bool stopped_ = false;
};

} // namespace

device_probe probe_devices() noexcept {
  device_probe out;
  try {
    errno = 0;
    int count = 0;
    ibv_device** list = ibv_get_device_list(&count);
    if (list == nullptr) {
      out.why_none = errno_text("ibv_get_device_list");
      return out;
    }
    std::string trouble;
    for (int i = 0; i < count; ++i) {
      const char* name = ibv_get_device_name(list[i]);
      ibv_context* ctx = ibv_open_device(list[i]);
      if (ctx == nullptr) {
        trouble = std::string(name) + ": " + errno_text("ibv_open_device");
        continue;
      }
      ibv_device_attr attr{};
      bool active = false;
      if (ibv_query_device(ctx, &attr) == 0)
        for (int port = 1; port <= attr.phys_port_cnt && !active; ++port) {
          ibv_port_attr pa{};
          active =
            ibv_query_port(ctx, static_cast<std::uint8_t>(port), &pa) == 0 &&
            pa.state == IBV_PORT_ACTIVE;
        }
      ibv_close_device(ctx);
      if (active)
        out.devices.emplace_back(name);
      else if (trouble.empty())
        trouble = std::string(name) + " has no active port";
    }
    ibv_free_device_list(list);
    if (out.devices.empty())
      out.why_none =
        count == 0 ? std::string("ibv_get_device_list: no devices") : trouble;
  } catch (...) {
    out.devices.clear();
    out.why_none = "out of memory probing RDMA devices";
  }
  return out;
}

std::unique_ptr<backend> make_backend(const endpoint_options& options) {
  return std::make_unique<rdma_backend>(options);
}

} // namespace h2::transport::rdma
