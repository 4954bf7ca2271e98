// The ring arithmetic shm and rdma share, and the credit bookkeeping of the
// rdma backend, which runs here although no RDMA device does: a simulated
// writer, network and reader exercise the same classes the queue pairs use,
// in random interleavings, and check every byte.
#include "h2/transport/ring.hpp"

#include "h2/core/error.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <numeric>
#include <random>
#include <vector>

namespace h2::transport {
namespace {

TEST(transport_ring, positions_map_modulo_the_capacity) {
  EXPECT_EQ(ring::offset_of(0, 16), 0u);
  EXPECT_EQ(ring::offset_of(15, 16), 15u);
  EXPECT_EQ(ring::offset_of(16, 16), 0u);
  EXPECT_EQ(ring::offset_of(37, 16), 5u);
  // Positions never wrap: far past 2^32.
  EXPECT_EQ(ring::offset_of((std::uint64_t{1} << 40) + 3, 1000),
            ((std::uint64_t{1} << 40) + 3) % 1000);
}

TEST(transport_ring, a_transfer_is_one_or_two_pieces) {
  auto p = ring::split(4, 8, 16); // fits before the end
  EXPECT_EQ(p.count(), 1);
  EXPECT_EQ(p.first.offset, 4u);
  EXPECT_EQ(p.first.bytes, 8u);
  EXPECT_EQ(p.second.bytes, 0u);

  p = ring::split(8, 8, 16); // ends exactly at the end: no second piece
  EXPECT_EQ(p.count(), 1);
  EXPECT_EQ(p.first.bytes, 8u);

  p = ring::split(16 * 3 + 12, 10, 16); // wraps
  EXPECT_EQ(p.count(), 2);
  EXPECT_EQ(p.first.offset, 12u);
  EXPECT_EQ(p.first.bytes, 4u);
  EXPECT_EQ(p.second.offset, 0u);
  EXPECT_EQ(p.second.bytes, 6u);

  p = ring::split(5, 16, 16); // the whole ring from the middle
  EXPECT_EQ(p.first.bytes + p.second.bytes, 16u);
  EXPECT_EQ(p.first.bytes, 11u);

  p = ring::split(7, 0, 16); // nothing
  EXPECT_EQ(p.count(), 1);
  EXPECT_EQ(p.first.bytes, 0u);
}

TEST(transport_ring, free_space_follows_head_and_tail) {
  EXPECT_EQ(ring::free_space(0, 0, 16), 16u);
  EXPECT_EQ(ring::free_space(16, 0, 16), 0u);
  EXPECT_EQ(ring::free_space(100, 90, 16), 6u);
  EXPECT_EQ(ring::used(100, 90), 10u);
  EXPECT_TRUE(ring::consistent(100, 90, 16));
  EXPECT_TRUE(ring::consistent(106, 90, 16));
  EXPECT_FALSE(ring::consistent(107, 90, 16)); // the head lapped the tail
  EXPECT_FALSE(ring::consistent(89, 90, 16));  // the tail passed the head
}

TEST(transport_ring, copies_round_trip_across_the_end) {
  constexpr std::uint64_t capacity = 64;
  std::vector<char> ring_bytes(capacity, 0);
  std::mt19937 rng(7);
  std::uint64_t position = 0;
  for (int round = 0; round < 500; ++round) {
    const std::size_t n = rng() % (capacity + 1);
    std::vector<char> in(n), out(n, 0);
    for (auto& c : in)
      c = static_cast<char>(rng());
    ring::copy_in(ring_bytes.data(), capacity, position, in.data(), n);
    // Every byte sits at its position modulo the capacity.
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(ring_bytes[(position + i) % capacity], in[i]) << round;
    ring::copy_out(ring_bytes.data(), capacity, position, out.data(), n);
    ASSERT_EQ(in, out) << round;
    position += rng() % (3 * capacity);
  }
}

TEST(transport_ring, writer_reuses_a_place_once_returned_and_completed) {
  ring::credit_writer w(100, 8);
  EXPECT_EQ(w.free_bytes(), 100u);
  w.stage(60);
  w.post(60);
  EXPECT_EQ(w.free_bytes(), 40u);
  EXPECT_TRUE(w.credit(60)); // returned, but the hardware still reads it
  EXPECT_EQ(w.free_bytes(), 40u);
  w.complete(60);
  EXPECT_EQ(w.free_bytes(), 100u);
  EXPECT_TRUE(w.drained());

  // Completion first, credit later: the same.
  w.stage(100);
  w.post(160);
  w.complete(160);
  EXPECT_EQ(w.free_bytes(), 0u);
  EXPECT_TRUE(w.credit(30));
  EXPECT_EQ(w.free_bytes(), 30u);
  EXPECT_THROW(w.stage(31), internal_error);
}

TEST(transport_ring, writer_refuses_credit_for_bytes_never_sent) {
  ring::credit_writer w(100, 8);
  w.stage(50);
  EXPECT_FALSE(w.credit(1)); // staged is not sent
  w.post(50);
  EXPECT_FALSE(w.credit(51));
  EXPECT_EQ(w.returned(), 0u);
  EXPECT_TRUE(w.credit(50));
  EXPECT_FALSE(w.credit(1));
}

TEST(transport_ring, notifications_in_flight_are_bounded) {
  ring::credit_writer w(1000, 3);
  for (std::uint64_t end : {10, 20, 30}) {
    ASSERT_TRUE(w.may_notify());
    w.stage(10);
    w.post(end);
  }
  EXPECT_FALSE(w.may_notify());
  w.stage(10);
  EXPECT_THROW(w.post(40), internal_error);
  // A notification counts until the last byte it carried is returned.
  EXPECT_TRUE(w.credit(9));
  EXPECT_FALSE(w.may_notify());
  EXPECT_TRUE(w.credit(1));
  EXPECT_TRUE(w.may_notify());
  EXPECT_EQ(w.notifications_in_flight(), 2u);
  EXPECT_TRUE(w.credit(20));
  EXPECT_EQ(w.notifications_in_flight(), 0u);
}

TEST(transport_ring, reader_refuses_an_overrun) {
  ring::credit_reader r(100, 25);
  EXPECT_TRUE(r.arrive(60));
  EXPECT_FALSE(r.arrive(41));
  EXPECT_TRUE(r.arrive(40));
  EXPECT_EQ(r.available(), 100u);
  r.consume(30);
  EXPECT_TRUE(r.arrive(30));
  EXPECT_FALSE(r.arrive(1));
  EXPECT_THROW(r.consume(101), internal_error);
}

TEST(transport_ring, reader_returns_credit_at_the_threshold_and_when_drained) {
  ring::credit_reader r(100, 25);
  ASSERT_TRUE(r.arrive(60));
  r.consume(10);
  EXPECT_EQ(r.credit_due(), 0u); // 10 owed, data left: wait for more
  r.consume(15);
  EXPECT_EQ(r.credit_due(), 25u); // the threshold
  r.credit_sent(25);
  EXPECT_EQ(r.credit_due(), 0u);
  r.consume(35);
  EXPECT_EQ(r.available(), 0u);
  EXPECT_EQ(r.credit_due(), 35u); // drained: a waiting writer needs it
  r.credit_sent(35);
  EXPECT_EQ(r.credit_due(), 0u);
  ASSERT_TRUE(r.arrive(3));
  r.consume(3);
  EXPECT_EQ(r.credit_due(), 3u); // drained again, however little
  EXPECT_THROW(r.credit_sent(4), internal_error);
}

/// The rdma data path without the hardware: a writer stages into a local
/// ring and posts notifying writes; the "network" places them, in order,
/// into the reader's ring (reading the staging ring when it does, as the
/// adapter would) and later reports local completion; the reader consumes
/// in random pieces and returns credits, which travel back in order. Every
/// step is chosen at random among those possible. It must deliver every
/// byte intact, never overrun either ring, and never get stuck.
void simulate(unsigned seed, std::uint64_t capacity,
              std::uint64_t max_notifications, std::uint64_t chunk) {
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  constexpr std::size_t total = 200'000;
  std::vector<char> source(total);
  for (auto& c : source)
    c = static_cast<char>(rng());

  ring::credit_writer writer(capacity, max_notifications);
  ring::credit_reader reader(capacity, capacity / 4);
  std::vector<char> staging(capacity), remote(capacity);
  struct write_op {
    std::uint64_t from, to;
  };
  std::deque<write_op> on_the_wire;  // posted, not yet placed
  std::deque<std::uint64_t> placed;  // placed, completion not yet seen
  std::deque<std::uint64_t> credits; // returned, not yet at the writer
  std::size_t produced = 0, received = 0;
  std::uint64_t notifications_outstanding = 0; // the reader's receives used
  std::uint64_t most_receives_used = 0;

  auto uniform = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };

  for (long steps = 0; received < total; ++steps) {
    ASSERT_LT(steps, 10'000'000) << "no progress";
    std::vector<int> possible;
    const std::uint64_t in_chunk = writer.staged() - writer.posted();
    if (produced < total && writer.free_bytes() > 0 && in_chunk < chunk)
      possible.push_back(0);
    if (writer.staged() > writer.posted() && writer.may_notify())
      possible.push_back(1);
    if (!on_the_wire.empty())
      possible.push_back(2);
    if (!placed.empty())
      possible.push_back(3);
    if (reader.available() > 0)
      possible.push_back(4);
    if (!credits.empty())
      possible.push_back(5);
    ASSERT_FALSE(possible.empty()) << "stuck after " << received << " bytes";
    switch (possible[uniform(0, possible.size() - 1)]) {
      case 0: { // stage
        const std::uint64_t n = uniform(
          1, std::min<std::uint64_t>(
               {writer.free_bytes(), total - produced, chunk - in_chunk}));
        ring::copy_in(staging.data(), capacity, writer.staged(),
                      source.data() + produced, n);
        writer.stage(n);
        produced += n;
        break;
      }
      case 1: // post
        on_the_wire.push_back({writer.posted(), writer.staged()});
        writer.post(writer.staged());
        ++notifications_outstanding;
        most_receives_used =
          std::max(most_receives_used, notifications_outstanding);
        break;
      case 2: { // the adapter reads the staging ring and places the bytes
        auto op = on_the_wire.front();
        on_the_wire.pop_front();
        std::vector<char> bytes(op.to - op.from);
        ring::copy_out(staging.data(), capacity, op.from, bytes.data(),
                       bytes.size());
        ring::copy_in(remote.data(), capacity, op.from, bytes.data(),
                      bytes.size());
        ASSERT_TRUE(reader.arrive(op.to - op.from)) << "overrun";
        --notifications_outstanding; // the receive is reposted at once
        placed.push_back(op.to);
        break;
      }
      case 3: // local completion
        writer.complete(placed.front());
        placed.pop_front();
        break;
      case 4: { // consume
        const std::uint64_t n = uniform(1, reader.available());
        std::vector<char> out(n);
        ring::copy_out(remote.data(), capacity, reader.consumed(), out.data(),
                       n);
        for (std::uint64_t i = 0; i < n; ++i)
          ASSERT_EQ(out[i], source[received + i])
            << "byte " << received + i << " corrupt";
        reader.consume(n);
        received += n;
        if (auto due = reader.credit_due()) {
          credits.push_back(due);
          reader.credit_sent(due);
        }
        break;
      }
      case 5: // a credit arrives
        ASSERT_TRUE(writer.credit(credits.front()));
        credits.pop_front();
        break;
    }
  }
  EXPECT_LE(most_receives_used, max_notifications);
  EXPECT_EQ(reader.consumed(), total);
}

TEST(transport_ring, credit_flow_delivers_everything_in_any_interleaving) {
  for (unsigned seed = 1; seed <= 20; ++seed)
    simulate(seed, 4096, 4, 1024);
  // Chunks as large as the ring, a single notification in flight.
  for (unsigned seed = 100; seed < 105; ++seed)
    simulate(seed, 1000, 1, 1000);
}

} // namespace
} // namespace h2::transport
