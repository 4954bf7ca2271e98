#include "h2/transport/endpoint.hpp"

#include "h2/transport/shm/channel.hpp"
#include "h2/transport/tcp/channel.hpp"

#include <h2/config.hpp>
#if H2_HAS_RDMA
#include "h2/transport/rdma/channel.hpp"
#endif

#include <algorithm>
#include <fstream>
#include <unistd.h>

namespace h2::transport {

std::string this_host_id() {
  std::string boot = "?";
  if (std::ifstream in("/proc/sys/kernel/random/boot_id"); in)
    std::getline(in, boot);
  char ns[64] = {};
  ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  return boot + "/" + (n > 0 ? std::string(ns, static_cast<std::size_t>(n))
                             : std::string("?"));
}

std::vector<std::string> available_backends() {
  std::vector<std::string> out{"shm"};
#if H2_HAS_RDMA
  out.push_back("rdma");
#endif
  out.push_back("tcp");
  return out;
}

namespace {

std::unique_ptr<backend> make(const std::string& name,
                              const endpoint_options& options) {
  if (name == "shm")
    return shm::make_backend(options);
  if (name == "tcp")
    return tcp::make_backend(options);
#if H2_HAS_RDMA
  if (name == "rdma")
    return rdma::make_backend(options);
#endif
  throw config_error("transport.backend",
                     "backend \"" + name + "\" is not built here");
}

/// Whether backend `name` can join `a` and `b`, judged from the addresses.
bool can_connect(const std::string& name, const endpoint_address& a,
                 const endpoint_address& b) {
  if (name == "shm")
    return !a.shm_socket.empty() && !b.shm_socket.empty() &&
           a.host_id == b.host_id;
  if (name == "rdma")
    return !a.rdma_device.empty() && !b.rdma_device.empty();
  if (name == "tcp")
    return a.tcp_port != 0 && b.tcp_port != 0;
  return false;
}

} // namespace

std::string choose_backend(const endpoint_address& a,
                           const endpoint_address& b,
                           const std::vector<std::string>& enabled,
                           std::string_view forced) {
  if (!forced.empty() && forced != "auto") {
    std::string f(forced);
    if (std::find(enabled.begin(), enabled.end(), f) == enabled.end() ||
        !can_connect(f, a, b))
      throw config_error("transport.backend",
                         "\"" + f + "\" cannot connect node " +
                           std::to_string(a.node_rank) + " and node " +
                           std::to_string(b.node_rank) +
                           (f == "shm" ? " (they are on different hosts)"
                                       : ""));
    return f;
  }
  for (const char* name : {"shm", "rdma", "tcp"})
    if (std::find(enabled.begin(), enabled.end(), name) != enabled.end() &&
        can_connect(name, a, b))
      return name;
  throw config_error("transport.backend",
                     "no backend connects node " + std::to_string(a.node_rank) +
                       " and node " + std::to_string(b.node_rank));
}

endpoint::endpoint(endpoint_options options) : options_(std::move(options)) {
  H2_ENFORCE(options_.secret != nullptr, "an endpoint needs the job's secret");
  address_.node_rank = options_.node_rank;
  address_.host_id = this_host_id();
  for (const auto& name : options_.backends) {
    auto b = make(name, options_);
    backend* raw = b.get();
    b->start(address_, [this, raw](std::unique_ptr<byte_link> link) {
      on_connection(*raw, std::move(link));
    });
    backends_.push_back(std::move(b));
  }
}

endpoint::~endpoint() {
  stop();
}

backend& endpoint::find(std::string_view name) {
  for (auto& b : backends_)
    if (b->name() == name)
      return *b;
  throw config_error("transport.backend",
                     "backend \"" + std::string(name) +
                       "\" is not running on node " +
                       std::to_string(options_.node_rank));
}

void endpoint::on_connection(backend& b, std::unique_ptr<byte_link> link) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (stopped_)
    return;
  handshakes_.emplace_back([this, &b, l = std::move(link)]() mutable {
    auto until = std::chrono::steady_clock::now() + options_.handshake_timeout;
    try {
      auto hs = accept_handshake(*l, *options_.secret,
                                 static_cast<std::uint32_t>(
                                   options_.node_rank),
                                 until);
      auto data = b.upgrade(std::move(l), true, until);
      auto ch = std::make_unique<framed_channel>(std::move(data),
                                                 options_.framing);
      std::lock_guard<std::mutex> g(mutex_);
      if (stopped_ || accepted_.count(hs.channel) != 0) {
        ++refused_;
        return;
      }
      accepted_.emplace(hs.channel, std::move(ch));
      arrived_.notify_all();
    } catch (const std::exception&) {
      // A peer without the secret, another protocol, or garbage: refused.
      // The dialer learns why from its own handshake.
      std::lock_guard<std::mutex> g(mutex_);
      ++refused_;
    }
  });
}

std::unique_ptr<channel> endpoint::dial(const endpoint_address& peer,
                                        std::uint64_t id,
                                        std::string_view backend_name,
                                        deadline until) {
  backend& b = find(backend_name);
  auto link = b.connect(peer, until);
  dial_handshake(*link, *options_.secret, id,
                 static_cast<std::uint32_t>(options_.node_rank), until);
  auto data = b.upgrade(std::move(link), false, until);
  return std::make_unique<framed_channel>(std::move(data), options_.framing);
}

std::unique_ptr<channel> endpoint::accept(std::uint64_t id, deadline until) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool ok = arrived_.wait_until(lock, until, [&] {
    return stopped_ || accepted_.count(id) != 0;
  });
  if (!ok)
    throw transport_error(transport_errc::timeout,
                          "node " + std::to_string(options_.node_rank) +
                            ": no peer connected channel " +
                            std::to_string(id) + " in time");
  if (accepted_.count(id) == 0)
    throw transport_error(transport_errc::cancelled,
                          "the endpoint was stopped");
  auto ch = std::move(accepted_[id]);
  accepted_.erase(id);
  return ch;
}

std::uint64_t endpoint::refused() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return refused_;
}

void endpoint::stop() noexcept {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (stopped_)
      return;
    stopped_ = true;
  }
  arrived_.notify_all();
  for (auto& b : backends_)
    b->stop();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    threads.swap(handshakes_);
    accepted_.clear();
  }
  for (auto& t : threads)
    if (t.joinable())
      t.join();
}

} // namespace h2::transport
