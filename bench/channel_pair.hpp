// Two endpoints of one job joined by a DiComm channel, both in this
// process, and the channel's throughput: the baseline of bench_dicomm and
// bench_rebalance (the same bytes over the raw channel).
#pragma once

#include "h2/transport/endpoint.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

namespace h2::bench {

namespace channel_detail {
using clock_type = std::chrono::steady_clock;
inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}
inline constexpr auto wait_long = std::chrono::seconds(60);
} // namespace channel_detail

/// Two endpoints of one job joined by a channel of `backend`.
struct channel_pair {
  std::unique_ptr<transport::endpoint> a, b;
  std::unique_ptr<transport::channel> tx, rx;

  channel_pair(const std::string& backend, bool crc) {
    auto secret = std::make_shared<const transport::job_secret>("bench");
    auto opts = [&](int rank) {
      transport::endpoint_options o;
      o.node_rank = rank;
      o.secret = secret;
      o.backends = {backend};
      o.framing.crc = crc;
      return o;
    };
    a = std::make_unique<transport::endpoint>(opts(0));
    b = std::make_unique<transport::endpoint>(opts(1));
    auto until = channel_detail::clock_type::now() + std::chrono::seconds(10);
    auto accepted =
      std::async(std::launch::async, [&] { return b->accept(1, until); });
    tx = a->dial(b->address(), 1, backend, until);
    rx = accepted.get();
  }
};

inline transport::message tensor_message(std::uint64_t tag, at::Tensor t) {
  transport::message m;
  m.tag = tag;
  m.tensor = std::move(t);
  return m;
}

/// Bytes per second of `n` messages of `bytes` over `p`, sent by one thread
/// and received by another (at least two in flight).
inline double channel_throughput(channel_pair& p, std::uint64_t bytes, int n) {
  auto t = at::empty({static_cast<std::int64_t>(bytes)}, at::kByte);
  t.fill_(7);
  auto once = [&](int count) {
    auto rx = std::async(std::launch::async, [&] {
      for (int i = 0; i < count; ++i)
        p.rx->recv(5, channel_detail::wait_long);
    });
    for (int i = 0; i < count; ++i)
      p.tx->send(tensor_message(5, t));
    rx.get();
  };
  once(n); // warm: rings mapped, buffers touched
  auto t0 = channel_detail::clock_type::now();
  once(n);
  return static_cast<double>(bytes) * n / channel_detail::seconds_since(t0);
}

} // namespace h2::bench
