// Connected channel pairs over every backend, for the conformance suite and
// the fault tests: two endpoints (nodes 0 and 1) of one job, a dial and an
// accept; the fixture that holds such a pair, and the messages and error
// checks the channel suites share.
#pragma once

#include "h2/transport/channel.hpp"
#include "h2/transport/endpoint.hpp"
#include "h2/transport/inproc/backend.hpp"

#include <h2/config.hpp>
#if H2_HAS_RDMA
#include "h2/transport/rdma/backend.hpp"
#endif

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

namespace h2::transport::test {

/// Upper bound for waits that must succeed: only stops a broken backend
/// from hanging the suite; never a performance threshold.
inline constexpr auto patience = std::chrono::seconds(20);

/// Polls `done` until it holds or `patience` runs out (for completions
/// that happen on an I/O thread).
template <class F>
bool eventually(F&& done) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

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
  o.rdma_ring_bytes = std::uint64_t{1} << 20; // and wrap the rdma ring
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

/// The byte-stream backends (framed channels): what the fault and receive
/// suites run over. rdma is skipped in SetUp, with the reason, where no
/// device exists.
inline const std::string stream_backends[] = {
  "shm",
  "tcp",
#if H2_HAS_RDMA
  "rdma",
#endif
};

/// A fixture holding a connected pair `a_`, `b_` (closed after the test);
/// `Base` is ::testing::Test or a ::testing::TestWithParam.
template <class Base = ::testing::Test>
class channel_pair_test : public Base {
protected:
  /// Skips the test, with the reason, where `backend` cannot run here;
  /// otherwise connects the pair with `make`, or make_pair_over(backend).
  /// Call from SetUp().
  void connect_over(const std::string& backend,
                    const std::function<channel_pair()>& make = {}) {
    if (auto why = unavailable(backend); !why.empty())
      GTEST_SKIP() << why;
    std::tie(a_, b_) = make ? make() : make_pair_over(backend);
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
  }

  void TearDown() override {
    if (a_)
      a_->close();
    if (b_)
      b_->close();
  }

  std::unique_ptr<channel> a_, b_;
};

/// A message of `text`'s bytes, tagged `tag`.
inline message bytes_message(std::uint64_t tag, const std::string& text) {
  message m;
  m.tag = tag;
  m.bytes.resize(text.size());
  if (!text.empty()) // an empty vector's data() may be null
    std::memcpy(m.bytes.data(), text.data(), text.size());
  return m;
}

/// A message of tensor `t`, tagged `tag`.
inline message tensor_message(std::uint64_t tag, at::Tensor t) {
  message m;
  m.tag = tag;
  m.tensor = std::move(t);
  return m;
}

/// The bytes of `m` as text.
inline std::string text_of(const message& m) {
  return std::string(reinterpret_cast<const char*>(m.bytes.data()),
                     m.bytes.size());
}

/// The code of the transport_error that `f` throws; a test failure (and
/// `cancelled`) when it throws none.
template <class F>
transport_errc error_of(F&& f) {
  try {
    f();
  } catch (const transport_error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no transport_error";
  return transport_errc::cancelled;
}

/// Sends `n` byte messages on tag 5 from `from`, each its index as text and
/// as its virtual send time, and checks that `to` receives them in order,
/// each within `patience` (fatal failures: call in ASSERT_NO_FATAL_FAILURE).
inline void expect_one_tag_in_order(channel& from, channel& to, int n,
                                    std::chrono::duration<double> patience) {
  for (int i = 0; i < n; ++i) {
    message m = bytes_message(5, std::to_string(i));
    m.sent.virtual_seconds = i;
    from.send(std::move(m));
  }
  for (int i = 0; i < n; ++i) {
    message m = to.recv(5, patience);
    ASSERT_EQ(m.tag, 5u);
    ASSERT_EQ(text_of(m), std::to_string(i));
    ASSERT_EQ(m.sent.virtual_seconds, i);
  }
}

} // namespace h2::transport::test
