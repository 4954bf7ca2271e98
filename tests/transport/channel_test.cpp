// Conformance tests every channel backend must pass, parametrised over a
// factory of connected pairs (as Gloo's send_recv_test and UCX's
// per-transport instantiation). A new backend is one more entry in
// `backends` below.
#include "pairs.hpp"

#include "h2/transport/channel.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

using test::bytes_message;
using test::channel_pair;
using test::tensor_message;
using test::text_of;

/// How to make one backend's connected pair, and what it promises beyond
/// the interface.
struct channel_backend {
  std::string name;    ///< the instance's
  std::string backend; ///< what its channels' backend() says
  std::function<channel_pair()> make_pair;
  bool zero_copy; ///< a received tensor is the sent one (same data_ptr)
};

void PrintTo(const channel_backend& b, std::ostream* os) {
  *os << b.name;
}

const channel_backend backends[] = {
  {"inproc", "inproc", [] { return test::make_pair_over("inproc"); }, true},
  // Tensors of 64 KiB and more are placed in the shared heap...
  {"shm", "shm", [] { return test::make_pair_over("shm"); }, false},
  // ...or, with no heap, every payload streams through the ring.
  {"shm_streamed", "shm",
   [] {
     return test::make_pair_over(
       "shm", [](endpoint_options& o) { o.shm_heap_bytes = 0; });
   },
   false},
  {"tcp", "tcp", [] { return test::make_pair_over("tcp"); }, false},
#if H2_HAS_RDMA
  // Skipped in SetUp, with the reason, where no RDMA device exists.
  {"rdma", "rdma", [] { return test::make_pair_over("rdma"); }, false},
#endif
};

using test::eventually;
using test::patience;

/// The wait of receives that must time out.
constexpr auto short_wait = 50ms;

/// Runs `f`, expecting transport_error with `code`.
template <class F>
void expect_transport_error(F&& f, transport_errc code) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << to_string(code);
  } catch (const transport_error& e) {
    EXPECT_EQ(e.code(), code)
      << "got " << to_string(e.code()) << ": " << e.what();
  }
}

class transport_channel : public test::channel_pair_test<
                            ::testing::TestWithParam<channel_backend>> {
protected:
  void SetUp() override {
    connect_over(GetParam().backend, GetParam().make_pair);
  }
};

TEST_P(transport_channel, names_its_backend) {
  EXPECT_EQ(a_->backend(), GetParam().backend);
  EXPECT_EQ(b_->backend(), GetParam().backend);
}

TEST_P(transport_channel, one_tag_arrives_in_order) {
  test::expect_one_tag_in_order(*a_, *b_, 1000, patience);
}

TEST_P(transport_channel, both_directions_are_separate) {
  a_->send(bytes_message(1, "from a"));
  b_->send(bytes_message(1, "from b"));
  EXPECT_EQ(text_of(a_->recv(1, patience)), "from b");
  EXPECT_EQ(text_of(b_->recv(1, patience)), "from a");
}

TEST_P(transport_channel, tags_are_independent) {
  a_->send(bytes_message(10, "a0"));
  a_->send(bytes_message(10, "a1"));
  a_->send(bytes_message(20, "b0"));
  // B first although A's messages are queued ahead of it.
  EXPECT_EQ(text_of(b_->recv(20, patience)), "b0");
  EXPECT_EQ(text_of(b_->recv(10, patience)), "a0");

  // A receive of B posted first is not completed by a message of A.
  pending_message pb = b_->recv_async(20);
  a_->send(bytes_message(10, "a2"));
  EXPECT_EQ(text_of(b_->recv(10, patience)), "a1");
  EXPECT_EQ(text_of(b_->recv(10, patience)), "a2");
  EXPECT_FALSE(pb.ready());
  a_->send(bytes_message(20, "b1"));
  message m = pb.get(patience);
  EXPECT_EQ(m.tag, 20u);
  EXPECT_EQ(text_of(m), "b1");
}

TEST_P(transport_channel, receives_posted_early_complete_in_order) {
  pending_message first = b_->recv_async(7);
  pending_message second = b_->recv_async(7);
  a_->send(bytes_message(7, "one"));
  a_->send(bytes_message(7, "two"));
  EXPECT_EQ(text_of(first.get(patience)), "one");
  EXPECT_EQ(text_of(second.get(patience)), "two");
}

TEST_P(transport_channel, zero_size_tensor_and_empty_bytes) {
  a_->send(tensor_message(1, at::empty({0, 5}, at::kFloat)));
  a_->send(bytes_message(2, ""));
  message t = b_->recv(1, patience);
  ASSERT_TRUE(t.tensor.defined());
  EXPECT_EQ(t.tensor.sizes(), (at::IntArrayRef{0, 5}));
  EXPECT_EQ(t.tensor.scalar_type(), at::kFloat);
  EXPECT_EQ(t.payload_bytes(), 0u);
  message e = b_->recv(2, patience);
  EXPECT_FALSE(e.tensor.defined());
  EXPECT_TRUE(e.bytes.empty());
  EXPECT_EQ(e.payload_bytes(), 0u);
}

TEST_P(transport_channel, tensor_keeps_shape_dtype_and_values) {
  at::Tensor sent = at::arange(12, at::kLong).reshape({3, 4});
  a_->send(tensor_message(3, sent));
  message m = b_->recv(3, patience);
  ASSERT_TRUE(m.tensor.defined());
  EXPECT_EQ(m.tensor.scalar_type(), at::kLong);
  EXPECT_EQ(m.tensor.sizes(), (at::IntArrayRef{3, 4}));
  EXPECT_TRUE(m.tensor.equal(at::arange(12, at::kLong).reshape({3, 4})));
  EXPECT_TRUE(m.bytes.empty());
}

TEST_P(transport_channel, large_tensor_arrives_intact) {
  constexpr std::int64_t n = 16 * 1024 * 1024; // 64 MiB of fp32
  // Every value below 2^24 is exact in fp32, so arange is its own checksum.
  at::Tensor sent = at::arange(n, at::kFloat);
  const void* sent_data = sent.data_ptr();
  a_->send(tensor_message(4, sent));
  message m = b_->recv(4, patience);
  ASSERT_TRUE(m.tensor.defined());
  EXPECT_EQ(m.payload_bytes(), 64u << 20);
  EXPECT_TRUE(m.tensor.equal(at::arange(n, at::kFloat)));
  if (GetParam().zero_copy) {
    EXPECT_EQ(m.tensor.data_ptr(), sent_data);
  }
}

TEST_P(transport_channel, held_tensors_keep_their_values) {
  // Receive buffers are reused once freed (framed.cpp's receive_pool): a
  // tensor the receiver still holds must never be written again, and a
  // freed one may be taken by the next message of its size.
  constexpr std::int64_t n = 256 * 1024; // 1 MiB of fp32
  std::vector<at::Tensor> held;
  for (int i = 0; i < 4; ++i) {
    a_->send(tensor_message(8, at::full({n}, static_cast<float>(i))));
    held.push_back(b_->recv(8, patience).tensor);
  }
  for (int round = 0; round < 3; ++round) {
    held.erase(held.begin()); // free the oldest: its buffer may be reused
    a_->send(tensor_message(8, at::full({n}, 100.0f + round)));
    held.push_back(b_->recv(8, patience).tensor);
  }
  std::vector<float> expected = {3, 100, 101, 102};
  ASSERT_EQ(held.size(), expected.size());
  for (std::size_t i = 0; i < held.size(); ++i)
    EXPECT_TRUE(held[i].equal(at::full({n}, expected[i]))) << "tensor " << i;
  // In-place updates of a received tensor stay its own.
  held[1].add_(1);
  EXPECT_TRUE(held[2].equal(at::full({n}, 101.0f)));
}

TEST_P(transport_channel, many_in_flight_from_two_threads) {
  constexpr int n = 3000;
  constexpr int tags = 4;
  constexpr int window = 64; // messages in flight per direction
  // Each end sends n messages round-robin over `tags` tags and, `window`
  // messages behind, receives the peer's in the same global order, which
  // per-tag ordering makes deterministic.
  auto run = [&](channel& self, const std::string& me, const std::string& peer,
                 std::string& failure) {
    try {
      auto receive = [&](int j) {
        message m = self.recv(static_cast<std::uint64_t>(j % tags), patience);
        std::string want = peer + std::to_string(j);
        if (text_of(m) != want && failure.empty())
          failure = me + " got " + text_of(m) + ", expected " + want;
      };
      for (int i = 0; i < n; ++i) {
        self.send(bytes_message(static_cast<std::uint64_t>(i % tags),
                                me + std::to_string(i)));
        if (i >= window)
          receive(i - window);
      }
      for (int j = n - window; j < n; ++j)
        receive(j);
    } catch (const std::exception& e) {
      failure = me + ": " + e.what();
    }
  };
  std::string fail_a, fail_b;
  std::thread ta([&] { run(*a_, "a", "b", fail_a); });
  std::thread tb([&] { run(*b_, "b", "a", fail_b); });
  ta.join();
  tb.join();
  EXPECT_EQ(fail_a, "");
  EXPECT_EQ(fail_b, "");
  auto sa = a_->stats();
  EXPECT_EQ(sa.messages_sent, static_cast<std::uint64_t>(n));
  EXPECT_EQ(sa.messages_received, static_cast<std::uint64_t>(n));
}

TEST_P(transport_channel, clock_stamps_are_carried) {
  message m = bytes_message(6, "x");
  m.sent = {1.5, 2.25};
  a_->send(std::move(m));
  message t = tensor_message(6, at::ones({2}));
  t.sent = {1e9 + 0.125, -0.0};
  a_->send(std::move(t));
  message r = b_->recv(6, patience);
  EXPECT_EQ(r.sent.virtual_seconds, 1.5);
  EXPECT_EQ(r.sent.wall_seconds, 2.25);
  message s = b_->recv(6, patience);
  EXPECT_EQ(s.sent.virtual_seconds, 1e9 + 0.125);
  EXPECT_EQ(s.sent.wall_seconds, 0.0);
}

TEST_P(transport_channel, receive_times_out) {
  expect_transport_error([&] { b_->recv(9, short_wait); },
                         transport_errc::timeout);
  pending_message p = b_->recv_async(9);
  expect_transport_error([&] { p.get(short_wait); }, transport_errc::timeout);
}

TEST_P(transport_channel, a_practically_endless_timeout_still_waits) {
  // Timeouts far beyond the steady clock's range (centuries) mean "wait":
  // they must not overflow into an immediate timeout.
  for (double seconds : {1e10, 1e12, 1e300}) {
    SCOPED_TRACE(seconds);
    std::thread sender([&] {
      std::this_thread::sleep_for(20ms);
      a_->send(bytes_message(8, "eventually"));
    });
    try {
      message m = b_->recv(8, std::chrono::duration<double>(seconds));
      EXPECT_EQ(text_of(m), "eventually");
    } catch (const transport_error& e) {
      ADD_FAILURE() << to_string(e.code()) << ": " << e.what();
      b_->recv(8, patience); // drain the message for the next round
    }
    sender.join();
  }
}

TEST_P(transport_channel, message_after_a_timeout_goes_to_the_next_receive) {
  expect_transport_error([&] { b_->recv(9, short_wait); },
                         transport_errc::timeout);
  pending_message p = b_->recv_async(9);
  expect_transport_error([&] { p.get(short_wait); }, transport_errc::timeout);
  a_->send(bytes_message(9, "late"));
  a_->send(bytes_message(9, "later"));
  EXPECT_EQ(text_of(b_->recv(9, patience)), "late");
  EXPECT_EQ(text_of(b_->recv(9, patience)), "later");
}

TEST_P(transport_channel, close_fails_the_peers_waiting_receive) {
  pending_message posted = b_->recv_async(3);
  transport_errc seen = transport_errc::timeout;
  bool failed = false;
  std::thread waiter([&] {
    try {
      b_->recv(4, patience);
    } catch (const transport_error& e) {
      failed = true;
      seen = e.code();
    }
  });
  std::this_thread::sleep_for(20ms); // usually waiting by now; either way
  a_->close();
  waiter.join();
  EXPECT_TRUE(failed);
  EXPECT_EQ(seen, transport_errc::peer_closed) << to_string(seen);
  expect_transport_error([&] { posted.get(patience); },
                         transport_errc::peer_closed);
  // Receives the peer starts later fail the same way.
  expect_transport_error([&] { b_->recv(5, patience); },
                         transport_errc::peer_closed);
}

TEST_P(transport_channel, close_cancels_own_calls) {
  pending_message own = a_->recv_async(3);
  a_->close();
  expect_transport_error([&] { own.get(patience); }, transport_errc::cancelled);
  expect_transport_error([&] { a_->send(bytes_message(1, "x")); },
                         transport_errc::cancelled);
  expect_transport_error([&] { a_->recv(1, patience); },
                         transport_errc::cancelled);
  a_->close(); // idempotent
  expect_transport_error([&] { a_->send(bytes_message(1, "x")); },
                         transport_errc::cancelled);
}

TEST_P(transport_channel, send_after_the_peer_closed) {
  b_->close();
  // Over a network the close takes a moment to arrive; once a receive has
  // seen it, sends fail too.
  expect_transport_error([&] { a_->recv(1, patience); },
                         transport_errc::peer_closed);
  expect_transport_error([&] { a_->send(bytes_message(1, "x")); },
                         transport_errc::peer_closed);
}

TEST_P(transport_channel, pending_message_ready) {
  pending_message p = b_->recv_async(3);
  EXPECT_FALSE(p.ready());
  a_->send(bytes_message(4, "other tag"));
  a_->send(bytes_message(3, "mine"));
  EXPECT_TRUE(eventually([&] { return p.ready(); }));
  EXPECT_EQ(text_of(p.get(patience)), "mine");
  EXPECT_FALSE(p.ready()); // used up
  EXPECT_THROW(p.get(patience), internal_error);

  // A message already queued: ready at once after posting (or soon).
  pending_message q = b_->recv_async(4);
  EXPECT_TRUE(eventually([&] { return q.ready(); }));
  EXPECT_EQ(text_of(q.get(patience)), "other tag");

  // A failure makes it ready too.
  pending_message r = b_->recv_async(5);
  EXPECT_FALSE(r.ready());
  a_->close();
  EXPECT_TRUE(eventually([&] { return r.ready(); }));
  expect_transport_error([&] { r.get(patience); }, transport_errc::peer_closed);
}

TEST_P(transport_channel, stats_count_messages_and_bytes) {
  auto zero = a_->stats();
  EXPECT_EQ(zero.messages_sent, 0u);
  EXPECT_EQ(zero.messages_received, 0u);
  EXPECT_EQ(zero.bytes_sent, 0u);
  EXPECT_EQ(zero.bytes_received, 0u);

  a_->send(bytes_message(1, std::string(10, 'x')));
  a_->send(bytes_message(1, std::string(20, 'y')));
  a_->send(tensor_message(2, at::ones({4}, at::kFloat))); // 16 bytes
  b_->send(bytes_message(1, std::string(7, 'z')));
  b_->recv(1, patience);
  b_->recv(1, patience);
  b_->recv(2, patience);
  a_->recv(1, patience);

  EXPECT_TRUE(eventually([&] {
    auto s = b_->stats();
    return s.messages_received == 3 && a_->stats().messages_received == 1;
  }));
  auto sa = a_->stats();
  EXPECT_EQ(sa.messages_sent, 3u);
  EXPECT_EQ(sa.messages_received, 1u);
  EXPECT_EQ(sa.bytes_sent, 46u);
  EXPECT_EQ(sa.bytes_received, 7u);
  auto sb = b_->stats();
  EXPECT_EQ(sb.messages_sent, 1u);
  EXPECT_EQ(sb.messages_received, 3u);
  EXPECT_EQ(sb.bytes_sent, 7u);
  EXPECT_EQ(sb.bytes_received, 46u);
}

INSTANTIATE_TEST_SUITE_P(
  transport, transport_channel, ::testing::ValuesIn(backends),
  [](const ::testing::TestParamInfo<channel_backend>& info) {
    return info.param.name;
  });

// ---------------------------------------------------------------------------

TEST(transport_message, payload_bytes) {
  message m;
  EXPECT_EQ(m.payload_bytes(), 0u);
  m.bytes.resize(13);
  EXPECT_EQ(m.payload_bytes(), 13u);
  m.tensor = at::ones({4, 4}, at::kDouble).t(); // non-contiguous
  EXPECT_EQ(m.payload_bytes(), 128u);
  // A view counts its own elements, not its storage.
  m.tensor = at::ones({100}, at::kFloat).narrow(0, 10, 5);
  EXPECT_EQ(m.payload_bytes(), 20u);
}

TEST(transport_errors, names) {
  EXPECT_EQ(to_string(transport_errc::timeout), "timeout");
  EXPECT_EQ(to_string(transport_errc::peer_closed), "peer closed");
  EXPECT_EQ(to_string(transport_errc::cancelled), "cancelled");
  EXPECT_EQ(to_string(transport_errc::corrupt_frame), "corrupt frame");
}

} // namespace
} // namespace h2::transport
