#include "h2/transport/endpoint.hpp"

#include "h2/transport/inproc/backend.hpp"
#include "h2/transport/rdma/backend.hpp"
#include "h2/transport/shm/backend.hpp"
#include "h2/transport/tcp/backend.hpp"

#include <h2/config.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <system_error>
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

endpoint::endpoint(endpoint_options options)
    : options_(std::move(options)), report_refusal_(options_.log) {
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
  const std::string peer = link->peer();
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopped_)
    return;
  reap_locked();
  const std::size_t most =
    std::max<std::size_t>(options_.max_pending_handshakes, 1);
  if (handshakes_.size() >= most) {
    // Cut off the oldest connection that has not proved the secret: a
    // dialer that knows it proves it within a round trip, so only silent
    // or slow peers are ever the oldest. Then wait for its thread, so that
    // threads never outnumber the slots.
    auto oldest = std::find_if(
      handshakes_.begin(), handshakes_.end(),
      [](const handshake_slot& s) { return !s.proved && s.link != nullptr; });
    if (oldest != handshakes_.end()) {
      oldest->link->shutdown(); // its thread refuses it
      oldest->link = nullptr;
    }
    handshake_done_.wait_for(lock, std::chrono::seconds(1), [&] {
      return stopped_ ||
             std::any_of(handshakes_.begin(), handshakes_.end(),
                         [](const handshake_slot& s) { return s.done; });
    });
    if (stopped_)
      return;
    reap_locked();
    if (handshakes_.size() >= most) {
      const std::size_t busy = handshakes_.size();
      lock.unlock();
      refuse(std::string(b.name()) + ": refused " + peer + ": " +
             std::to_string(busy) + " handshakes in progress already");
      return;
    }
  }
  auto& slot = handshakes_.emplace_back();
  slot.link = link.get();
  try {
    slot.thread = std::thread([this, &b, &slot, l = std::move(link)]() mutable {
      run_handshake(b, std::move(l), slot);
    });
  } catch (const std::system_error& e) {
    // No thread left in the process: refuse this one, keep listening.
    handshakes_.pop_back();
    lock.unlock();
    refuse(std::string(b.name()) + ": refused " + peer +
           ": cannot start its handshake: " + e.what());
  }
}

void endpoint::run_handshake(backend& b, std::unique_ptr<byte_link> link,
                             handshake_slot& slot) {
  const std::string peer = link->peer();
  std::string why;
  try {
    auto until = std::chrono::steady_clock::now() + options_.handshake_timeout;
    auto hs =
      accept_handshake(*link, *options_.secret,
                       static_cast<std::uint32_t>(options_.node_rank), until);
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (slot.link == nullptr) // cut off as the handshake finished
        throw transport_error(transport_errc::cancelled, "cut off");
      slot.proved = true;
      slot.link = nullptr;
    }
    auto data = b.upgrade(std::move(link), true, until);
    auto ch =
      std::make_unique<framed_channel>(std::move(data), options_.framing);
    std::lock_guard<std::mutex> g(mutex_);
    if (!stopped_ && accepted_.count(hs.channel) == 0) {
      accepted_.emplace(hs.channel, std::move(ch));
      arrived_.notify_all();
      slot.done = true;
      handshake_done_.notify_all();
      return;
    }
    why = "channel " + std::to_string(hs.channel) + " is connected already";
  } catch (const std::exception& e) {
    // A peer without the secret, another protocol, garbage, silence past
    // the timeout, or cut off for a newer connection: refused. The dialer
    // learns why from its own handshake.
    why = e.what();
  }
  bool stopping = false;
  {
    std::lock_guard<std::mutex> g(mutex_);
    slot.link = nullptr; // before the link goes: nobody cuts it off now
    stopping = stopped_;
  }
  link.reset(); // the descriptor goes before the slot is reaped
  if (!stopping)
    refuse(std::string(b.name()) + ": refused " + peer + ": " + why);
  std::lock_guard<std::mutex> g(mutex_);
  slot.done = true;
  handshake_done_.notify_all();
}

void endpoint::reap_locked() {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if (!it->done) {
      ++it;
      continue;
    }
    // done is its thread's last write under the mutex: the join is short.
    if (it->thread.joinable())
      it->thread.join();
    it = handshakes_.erase(it);
  }
}

void endpoint::refuse(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mutex_);
    ++refused_;
  }
  report_refusal_("node " + std::to_string(options_.node_rank) + ": " + why);
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

std::size_t endpoint::pending_handshakes() const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::size_t n = 0;
  for (const auto& slot : handshakes_)
    n += slot.done ? 0 : 1;
  return n;
}

void endpoint::stop() noexcept {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (stopped_)
      return;
    stopped_ = true;
  }
  arrived_.notify_all();
  handshake_done_.notify_all();
  for (auto& b : backends_)
    b->stop();
  // No new slots now (stopped_, listeners joined): cut off the handshakes
  // in progress and join their threads.
  std::list<handshake_slot> slots;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto& slot : handshakes_)
      if (slot.link != nullptr)
        slot.link->shutdown();
    slots.swap(handshakes_);
    accepted_.clear();
  }
  for (auto& slot : slots)
    if (slot.thread.joinable())
      slot.thread.join();
}

} // namespace h2::transport
