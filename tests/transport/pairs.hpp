// Connected channel pairs over every backend, for the conformance suite and
// the fault tests: two endpoints (nodes 0 and 1) of one job, a dial and an
// accept.
#pragma once

#include "h2/transport/endpoint.hpp"
#include "h2/transport/inproc/channel.hpp"

#include <h2/config.hpp>
#if H2_HAS_RDMA
#include "h2/transport/rdma/channel.hpp"
#endif

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>

namespace h2::transport::test {

using channel_pair =
  std::pair<std::unique_ptr<channel>, std::unique_ptr<channel>>;

inline std::shared_ptr<const job_secret> test_secret() {
  return std::make_shared<const job_secret>("conformance-secret");
}

inline endpoint_options options_for(int rank, const std::string& backend,
                                    std::shared_ptr<const job_secret> secret =
                                      test_secret()) {
  endpoint_options o;
  o.node_rank = rank;
  o.secret = std::move(secret);
  o.backends = {backend};
  o.shm_ring_bytes = std::uint64_t{1} << 20; // small: big messages stream
  o.handshake_timeout = std::chrono::milliseconds(5000);
  return o;
}

/// Dials `id` from `a` to `b` and accepts it on `b`.
inline channel_pair connect(endpoint& a, endpoint& b,
                            const std::string& backend,
                            std::uint64_t id = 42) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto accepted = std::async(std::launch::async,
                             [&] { return b.accept(id, until); });
  auto dialed = a.dial(b.address(), id, backend, until);
  return {std::move(dialed), accepted.get()};
}

/// Why `backend` cannot run on this machine ("" when it can): what a test
/// GTEST_SKIP()s with. Only rdma needs hardware.
inline std::string unavailable(const std::string& backend) {
#if H2_HAS_RDMA
  if (backend == "rdma") {
    auto probe = rdma::probe_devices();
    if (probe.devices.empty())
      return "no RDMA device: " + probe.why_none;
    // A device, but rdma_cm may not reach it through loopback (RoCE needs
    // an address on the device's own interface).
    auto o = options_for(0, "rdma");
    endpoint e(o);
    if (e.address().rdma_device.empty())
      return "RDMA device " + probe.devices.front() +
             " found, but the rdma backend cannot listen on " + o.bind_host;
  }
#endif
  (void)backend;
  return "";
}

/// A pair over `backend` ("inproc", "shm", "tcp", "rdma"); `tweak`, when
/// given, changes both endpoints' options first.
inline channel_pair
make_pair_over(const std::string& backend,
               const std::function<void(endpoint_options&)>& tweak = {}) {
  if (backend == "inproc")
    return inproc::make_pair();
  auto a_options = options_for(0, backend);
  auto b_options = options_for(1, backend);
  if (tweak) {
    tweak(a_options);
    tweak(b_options);
  }
  endpoint a(a_options);
  endpoint b(b_options);
  return connect(a, b, backend);
}

} // namespace h2::transport::test
