// The framed channels' one receive path (docs/transport.md, Receiving): a
// receive that waits reads the link itself, on every byte-stream backend;
// the reader thread drains only what nobody waits for; many waiters share
// the link (one watches, the others wait for it); close() and a peer's end
// reach every waiting receive as typed errors, in bounded time.
#include "pairs.hpp"

#include "h2/transport/framed.hpp"
#include "h2/transport/socket_link.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

using test::patience;

/// How long a receive has waited before the message comes: past any poll
/// (transport/spin.hpp: at most 500 us), so it sleeps on the link.
constexpr auto asleep = 30ms;

/// The bound within which close() or a peer's end must reach a waiting
/// receive (its own timeout is `patience`).
constexpr auto prompt = 2s;

using test::bytes_message;
using test::text_of;

/// The error code `f` fails with, and how long it took.
template <class F>
std::pair<transport_errc, clock_type::duration> failure_of(F&& f) {
  const auto start = clock_type::now();
  try {
    f();
  } catch (const transport_error& e) {
    return {e.code(), clock_type::now() - start};
  }
  ADD_FAILURE() << "no transport_error";
  return {transport_errc::timeout, clock_type::now() - start};
}

// -- who reads: a link that records the threads that got bytes ---------------

/// Forwards to a socket_link and records which threads read bytes from it.
class recording_link final : public byte_link {
public:
  explicit recording_link(std::unique_ptr<byte_link> inner)
      : inner_(std::move(inner)) {}

  void write(std::initializer_list<buffer_view> parts,
             deadline until) override {
    inner_->write(parts, until);
  }
  std::size_t read_some(void* data, std::size_t size) override {
    const std::size_t n = inner_->read_some(data, size);
    if (n > 0) {
      std::lock_guard<std::mutex> guard(mutex_);
      readers_.push_back(std::this_thread::get_id());
    }
    return n;
  }
  std::uint32_t wake_count() const noexcept override {
    return inner_->wake_count();
  }
  void wait_readable(std::uint32_t seen, deadline until) override {
    inner_->wait_readable(seen, until);
  }
  void nudge() noexcept override { inner_->nudge(); }
  void wait_drain(std::uint32_t seen) override { inner_->wait_drain(seen); }
  std::size_t read_ahead_bytes() const noexcept override {
    return inner_->read_ahead_bytes();
  }
  void shutdown() noexcept override { inner_->shutdown(); }
  std::string_view backend() const noexcept override { return "tcp"; }
  std::string peer() const override { return "recorded peer"; }

  /// The threads that got bytes, in order; cleared.
  std::vector<std::thread::id> take_readers() {
    std::lock_guard<std::mutex> guard(mutex_);
    return std::exchange(readers_, {});
  }

private:
  std::unique_ptr<byte_link> inner_;
  std::mutex mutex_;
  std::vector<std::thread::id> readers_;
};

/// A framed channel over a recording link on one end of a socket pair, and
/// a framed channel on the other end to send with.
struct recorded_pair {
  recorded_pair() {
    int fds[2];
    EXPECT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM, 0, fds));
    auto link = std::make_unique<recording_link>(
      std::make_unique<socket_link>(fds[0], "tcp", "recorded"));
    recorder = link.get();
    rx = std::make_unique<framed_channel>(std::move(link), framed_options{});
    tx = std::make_unique<framed_channel>(
      std::make_unique<socket_link>(fds[1], "tcp", "sender"), framed_options{});
  }
  recording_link* recorder;
  std::unique_ptr<framed_channel> rx, tx;
};

TEST(transport_receive, a_waiting_receive_reads_the_link_itself) {
  recorded_pair p;
  // Long enough for the reader thread to wait for bytes nobody waits for.
  std::this_thread::sleep_for(asleep);
  std::thread::id waiter;
  std::string got;
  std::thread t([&] {
    waiter = std::this_thread::get_id();
    got = text_of(p.rx->recv(1, patience));
  });
  std::this_thread::sleep_for(asleep);
  p.tx->send(bytes_message(1, "for the waiter"));
  t.join();
  EXPECT_EQ(got, "for the waiter");
  auto readers = p.recorder->take_readers();
  ASSERT_FALSE(readers.empty());
  for (auto id : readers)
    EXPECT_EQ(id, waiter) << "a thread other than the waiting receive read";
}

TEST(transport_receive, the_reader_thread_drains_what_nobody_waits_for) {
  recorded_pair p;
  p.tx->send(bytes_message(2, "unasked"));
  const auto until = clock_type::now() + patience;
  std::vector<std::thread::id> readers;
  while (readers.empty() && clock_type::now() < until) {
    std::this_thread::sleep_for(1ms);
    readers = p.recorder->take_readers();
  }
  ASSERT_FALSE(readers.empty()) << "nobody drained the link";
  EXPECT_NE(readers.front(), std::this_thread::get_id());
  // Already in the mailbox: the receive completes without the link.
  auto pending = p.rx->recv_async(2);
  EXPECT_TRUE(pending.ready());
  EXPECT_EQ(text_of(pending.get(patience)), "unasked");
  EXPECT_TRUE(p.recorder->take_readers().empty());
}

TEST(transport_receive, a_message_another_thread_reads_wakes_its_watcher) {
  recorded_pair p;
  std::string got;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    got = text_of(p.rx->recv(1, patience));
    done = true;
  });
  std::this_thread::sleep_for(asleep); // the watcher sleeps on the link
  // This thread polls the link (ready()) and so often reads the watcher's
  // message before it wakes: the watcher must then be woken for it, not
  // by its timeout.
  auto other = p.rx->recv_async(2);
  p.tx->send(bytes_message(1, "read elsewhere"));
  const auto start = clock_type::now();
  while (!done && clock_type::now() - start < prompt)
    (void)other.ready();
  watcher.join();
  EXPECT_EQ(got, "read elsewhere");
  EXPECT_LT(clock_type::now() - start, prompt);
  p.tx->send(bytes_message(2, "second"));
  EXPECT_EQ(text_of(other.get(patience)), "second");
}

// -- over every byte-stream backend -------------------------------------------

class transport_receive_over
    : public test::channel_pair_test<::testing::TestWithParam<std::string>> {
protected:
  void SetUp() override { connect_over(GetParam()); }

  /// Starts `waiters` receives on b_ (tags 0, 1, ...) and lets them sleep
  /// on the link (one watches, the others follow), then runs `end`: every
  /// receive must fail with `want`, within `prompt` of it.
  void expect_waiting_receives_end(int waiters,
                                   const std::function<void()>& end,
                                   transport_errc want) {
    std::vector<std::pair<transport_errc, clock_type::duration>> seen(
      static_cast<std::size_t>(waiters));
    std::vector<std::thread> threads;
    for (int w = 0; w < waiters; ++w)
      threads.emplace_back([&, w] {
        seen[static_cast<std::size_t>(w)] = failure_of(
          [&] { b_->recv(static_cast<std::uint64_t>(w), patience); });
      });
    std::this_thread::sleep_for(asleep);
    const auto ended = clock_type::now();
    end();
    for (auto& t : threads)
      t.join();
    EXPECT_LT(clock_type::now() - ended, prompt);
    for (int w = 0; w < waiters; ++w)
      EXPECT_EQ(seen[static_cast<std::size_t>(w)].first, want)
        << "waiter " << w << ": "
        << to_string(seen[static_cast<std::size_t>(w)].first);
  }
};

TEST_P(transport_receive_over,
       a_receive_waiting_on_an_idle_channel_gets_its_message) {
  // Nobody waited for a while: the reader thread waits for bytes itself.
  std::this_thread::sleep_for(asleep);
  for (int round = 0; round < 3; ++round) {
    std::string got;
    std::thread t([&] { got = text_of(b_->recv(1, patience)); });
    std::this_thread::sleep_for(asleep);
    a_->send(bytes_message(1, "round " + std::to_string(round)));
    t.join();
    EXPECT_EQ(got, "round " + std::to_string(round));
    std::this_thread::sleep_for(asleep); // idle again
  }
}

TEST_P(transport_receive_over, many_waiters_on_different_tags) {
  constexpr int waiters = 8, per_tag = 200;
  std::vector<std::string> failures(waiters);
  std::vector<std::thread> threads;
  for (int w = 0; w < waiters; ++w)
    threads.emplace_back([&, w] {
      try {
        for (int i = 0; i < per_tag; ++i) {
          auto m = b_->recv(static_cast<std::uint64_t>(100 + w), patience);
          const std::string want = std::to_string(w) + ":" + std::to_string(i);
          if (text_of(m) != want) {
            failures[static_cast<std::size_t>(w)] =
              "got " + text_of(m) + ", expected " + want;
            return;
          }
        }
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(w)] = e.what();
      }
    });
  // Every tag in order, the tags shuffled; now and then a pause, so that
  // the waiters sleep on the link and hand it over.
  std::vector<int> order;
  for (int w = 0; w < waiters; ++w)
    order.insert(order.end(), per_tag, w);
  std::shuffle(order.begin(), order.end(), std::mt19937(42));
  std::vector<int> next(waiters, 0);
  for (std::size_t k = 0; k < order.size(); ++k) {
    const int w = order[k];
    a_->send(
      bytes_message(static_cast<std::uint64_t>(100 + w),
                    std::to_string(w) + ":" +
                      std::to_string(next[static_cast<std::size_t>(w)]++)));
    if (k % 97 == 0)
      std::this_thread::sleep_for(2ms);
  }
  for (auto& t : threads)
    t.join();
  for (int w = 0; w < waiters; ++w)
    EXPECT_EQ(failures[static_cast<std::size_t>(w)], "") << "tag " << 100 + w;
}

TEST_P(transport_receive_over, a_waiter_watches_once_the_watcher_timed_out) {
  std::atomic<bool> first_timed_out{false};
  std::thread first([&] {
    try {
      b_->recv(1, 100ms);
    } catch (const transport_error& e) {
      first_timed_out = e.code() == transport_errc::timeout;
    }
  });
  std::this_thread::sleep_for(20ms); // `first` watches the link
  std::string got;
  std::thread second([&] { got = text_of(b_->recv(2, patience)); });
  first.join();
  EXPECT_TRUE(first_timed_out);
  std::this_thread::sleep_for(asleep); // `second` watches now
  const auto sent = clock_type::now();
  a_->send(bytes_message(2, "to the second"));
  second.join();
  EXPECT_EQ(got, "to the second");
  EXPECT_LT(clock_type::now() - sent, prompt);
}

TEST_P(transport_receive_over, close_ends_every_waiting_receive_as_cancelled) {
  expect_waiting_receives_end(
    4, [&] { b_->close(); }, transport_errc::cancelled);
}

TEST_P(transport_receive_over, peer_close_ends_every_waiting_receive) {
  expect_waiting_receives_end(
    4, [&] { a_->close(); }, transport_errc::peer_closed);
}

TEST_P(transport_receive_over, a_channel_destroyed_under_a_waiting_receive) {
  // The waiting receive holds the channel's receiver, not the channel: it
  // must end (cancelled) and never touch the link after it is gone.
  std::pair<transport_errc, clock_type::duration> seen;
  auto pending = b_->recv_async(1);
  std::thread t([&] { seen = failure_of([&] { pending.get(patience); }); });
  std::this_thread::sleep_for(asleep);
  b_.reset();
  t.join();
  EXPECT_EQ(seen.first, transport_errc::cancelled) << to_string(seen.first);
  EXPECT_LT(seen.second, asleep + prompt);
}

INSTANTIATE_TEST_SUITE_P(transport, transport_receive_over,
                         ::testing::ValuesIn(test::stream_backends),
                         [](const auto& info) { return info.param; });

} // namespace
} // namespace h2::transport
