#include "h2/transport/endpoint.hpp"

#include "h2/transport/inproc/backend.hpp"
#include "h2/transport/rdma/backend.hpp"
#include "h2/transport/shm/backend.hpp"
#include "h2/transport/tcp/backend.hpp"

#include <h2/config.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <unistd.h>

namespace h2::transport {

bind_error::bind_error(std::string backend, std::string address,
                       int sys_errno)
    : error(backend + ": cannot listen on " + address + ": " +
            std::strerror(sys_errno)),
      address_(std::move(address)),
      sys_errno_(sys_errno) {
}

std::string this_host_id() {
  std::string boot = "?";
  if (std::ifstream in("/proc/sys/kernel/random/boot_id"); in)
    std::getline(in, boot);
  char ns[64] = {};
  ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  return boot + "/" + (n > 0 ? std::string(ns, static_cast<std::size_t>(n))
                             : std::string("?"));
}

namespace {

/// One row of the backend table.
struct backend_row {
  std::string_view name;
  /// The backend's own judgement, from the two addresses alone.
  bool (*can_connect)(const endpoint_address&, const endpoint_address&);
  /// Starts it in an endpoint; null for inproc (no endpoint: in-process
  /// pairs are made by inproc::make_pair) and for a backend this build
  /// lacks.
  std::unique_ptr<backend> (*make)(const endpoint_options&);
};

/// Every backend, in the order choose_backend() tries them
/// (docs/transport.md, Which backend): the cheapest that can join a pair
/// first. The one place that knows the backends by name.
constexpr backend_row backend_table[] = {
  {"inproc", &inproc::can_connect, nullptr},
  {"shm", &shm::can_connect, &shm::make_backend},
#if H2_HAS_RDMA
  {"rdma", &rdma::can_connect, &rdma::make_backend},
#else
  {"rdma", &rdma::can_connect, nullptr},
#endif
  {"tcp", &tcp::can_connect, &tcp::make_backend},
};

const backend_row* find_row(std::string_view name) {
  for (const auto& row : backend_table)
    if (row.name == name)
      return &row;
  return nullptr;
}

std::string known_backends() {
  std::string out;
  for (const auto& row : backend_table)
    out += (out.empty() ? "\"" : ", \"") + std::string(row.name) + "\"";
  return out;
}

config_error unknown_backend(const std::string& name) {
  return config_error("transport.backend", "unknown backend \"" + name +
                                             "\" (known: " +
                                             known_backends() + ")");
}

std::unique_ptr<backend> make(const std::string& name,
                              const endpoint_options& options) {
  const backend_row* row = find_row(name);
  if (row == nullptr)
    throw unknown_backend(name);
  if (row->make == nullptr)
    throw config_error("transport.backend",
                       name == "inproc"
                         ? std::string("inproc joins the chips of one node "
                                       "and runs in no endpoint")
                         : "backend \"" + name + "\" is not built here");
  return row->make(options);
}

std::string nodes(const endpoint_address& a, const endpoint_address& b) {
  return "node " + std::to_string(a.node_rank) + " and node " +
         std::to_string(b.node_rank);
}

} // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> out;
  for (const auto& row : backend_table)
    if (row.make != nullptr)
      out.emplace_back(row.name);
  return out;
}

std::string choose_backend(const endpoint_address& a,
                           const endpoint_address& b,
                           const std::vector<std::string>& enabled,
                           std::string_view forced) {
  // Row 0 first: one process needs no transport, whatever is forced.
  const backend_row& local = backend_table[0];
  if (local.can_connect(a, b))
    return std::string(local.name);
  auto is_enabled = [&](std::string_view name) {
    return std::find(enabled.begin(), enabled.end(), name) != enabled.end();
  };
  if (!forced.empty() && forced != "auto") {
    std::string f(forced);
    const backend_row* row = find_row(f);
    if (row == nullptr)
      throw unknown_backend(f);
    if (!is_enabled(f)) {
      std::string list;
      for (const auto& e : enabled)
        list += (list.empty() ? "" : ", ") + e;
      throw config_error("transport.backend",
                         "\"" + f + "\" cannot connect " + nodes(a, b) +
                           ": it is not enabled here (enabled: " + list + ")");
    }
    if (!row->can_connect(a, b))
      throw config_error("transport.backend",
                         "\"" + f + "\" cannot connect " + nodes(a, b) +
                           (f == "shm" ? " (they are on different hosts)"
                                       : ""));
    return f;
  }
  for (const auto& row : backend_table)
    if (is_enabled(row.name) && row.can_connect(a, b))
      return std::string(row.name);
  throw config_error("transport.backend", "no backend connects " + nodes(a, b));
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
