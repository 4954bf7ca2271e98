// What the conformance suite cannot show with both ends in one process:
// a peer that does not know the secret or speaks another protocol version,
// corrupt and truncated frames, concurrent channels, and a peer process
// killed (SIGKILL) or stopped (SIGSTOP) while a receive waits on it.
#include "pairs.hpp"

#include "h2/core/crc32c.hpp"
#include "h2/transport/socket_link.hpp"
#include "h2/transport/wire.hpp"

#include <gtest/gtest.h>

#include <limits>

#include <ATen/ops/arange.h>
#include <ATen/ops/zeros.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char** environ;

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

using test::bytes_message;
using test::error_of;
using test::text_of;

class transport_fault : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    if (auto why = test::unavailable(GetParam()); !why.empty())
      GTEST_SKIP() << why;
  }
};

TEST_P(transport_fault, wrong_secret_is_refused_on_both_sides) {
  endpoint a(test::options_for(0, GetParam()));
  endpoint b(test::options_for(
    1, GetParam(), std::make_shared<const job_secret>("another job")));
  auto until = std::chrono::steady_clock::now() + 10s;
  EXPECT_EQ(error_of([&] { b.dial(a.address(), 7, GetParam(), until); }),
            transport_errc::unauthorized);
  // Nothing reached node 0: its accept times out and it counted a refusal.
  EXPECT_EQ(error_of([&] {
              a.accept(7, std::chrono::steady_clock::now() + 200ms);
            }),
            transport_errc::timeout);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  while (a.refused() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(a.refused(), 1u);
}

TEST_P(transport_fault, concurrent_channels_stay_apart) {
  endpoint a(test::options_for(0, GetParam()));
  endpoint b(test::options_for(1, GetParam()));
  constexpr int channels = 6, messages = 200;
  std::vector<test::channel_pair> pairs;
  for (int c = 0; c < channels; ++c)
    pairs.push_back(test::connect(a, b, GetParam(), 100 + c));
  std::vector<std::thread> threads;
  for (int c = 0; c < channels; ++c)
    threads.emplace_back([&, c] {
      for (int i = 0; i < messages; ++i) {
        message m;
        m.tag = 9;
        m.tensor = at::arange(c * 1000 + i, c * 1000 + i + 64, at::kLong);
        pairs[static_cast<std::size_t>(c)].first->send(std::move(m));
      }
    });
  for (int c = 0; c < channels; ++c)
    for (int i = 0; i < messages; ++i) {
      message m = pairs[static_cast<std::size_t>(c)].second->recv(9, 20s);
      ASSERT_EQ(m.tensor[0].item<std::int64_t>(), c * 1000 + i);
    }
  for (auto& t : threads)
    t.join();
}

/// Spawns h2-transport-peer dialing `a`; returns its pid.
pid_t spawn_peer(const endpoint& a, const std::string& backend,
                 std::uint64_t id) {
  const auto& addr = a.address();
  std::vector<std::string> args = {
    H2_TRANSPORT_PEER,
    backend,
    addr.host_id,
    addr.tcp_host.empty() ? "-" : addr.tcp_host,
    std::to_string(addr.tcp_port),
    addr.shm_socket.empty() ? "-" : addr.shm_socket,
    "conformance-secret",
    std::to_string(id),
    addr.rdma_device.empty() ? "-" : addr.rdma_device,
    std::to_string(addr.rdma_port)};
  std::vector<char*> argv;
  for (auto& s : args)
    argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  EXPECT_EQ(0, posix_spawn(&pid, H2_TRANSPORT_PEER, nullptr, nullptr,
                           argv.data(), environ));
  return pid;
}

/// The channel to a live echoing peer process.
std::unique_ptr<channel> echo_peer(endpoint& a, const std::string& backend,
                                   pid_t& pid) {
  pid = spawn_peer(a, backend, 5);
  auto ch = a.accept(5, std::chrono::steady_clock::now() + 20s);
  ch->send(bytes_message(1, "ping"));
  EXPECT_EQ(text_of(ch->recv(2, 20s)), "ping");
  return ch;
}

// The bound within which a dead peer must surface as a typed error: the
// receive's own timeout. Were the death noticed later, the receive would
// fail with `timeout` instead and the test with it.
constexpr auto death_bound = 5s;

TEST_P(transport_fault, killed_peer_fails_the_waiting_receive) {
  endpoint a(test::options_for(0, GetParam()));
  pid_t pid = 0;
  auto ch = echo_peer(a, GetParam(), pid);
  auto waiting = ch->recv_async(2);
  ASSERT_EQ(0, ::kill(pid, SIGKILL));
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(error_of([&] { waiting.get(death_bound); }),
            transport_errc::peer_closed);
  EXPECT_EQ(error_of([&] { ch->recv(2, death_bound); }),
            transport_errc::peer_closed);
}

TEST_P(transport_fault, killed_peer_fails_receives_already_waiting) {
  // Receives that sleep on the link when the peer dies (one watches it, the
  // others wait for it; docs/transport.md, Receiving) each fail with
  // peer_closed, within the bound.
  endpoint a(test::options_for(0, GetParam()));
  pid_t pid = 0;
  auto ch = echo_peer(a, GetParam(), pid);
  constexpr int waiters = 3;
  std::vector<transport_errc> seen(waiters, transport_errc::timeout);
  std::vector<std::thread> threads;
  for (int w = 0; w < waiters; ++w)
    threads.emplace_back([&, w] {
      seen[static_cast<std::size_t>(w)] = error_of(
        [&] { ch->recv(static_cast<std::uint64_t>(10 + w), death_bound); });
    });
  std::this_thread::sleep_for(50ms); // all asleep: past any poll
  EXPECT_EQ(0, ::kill(pid, SIGKILL));
  ::waitpid(pid, nullptr, 0);
  for (auto& t : threads)
    t.join();
  for (int w = 0; w < waiters; ++w)
    EXPECT_EQ(seen[static_cast<std::size_t>(w)], transport_errc::peer_closed)
      << "waiter " << w << ": "
      << to_string(seen[static_cast<std::size_t>(w)]);
}

TEST_P(transport_fault, stopped_peer_times_out) {
  endpoint a(test::options_for(0, GetParam()));
  pid_t pid = 0;
  auto ch = echo_peer(a, GetParam(), pid);
  ASSERT_EQ(0, ::kill(pid, SIGSTOP));
  ch->send(bytes_message(1, "anyone?"));
  EXPECT_EQ(error_of([&] { ch->recv(2, 300ms); }), transport_errc::timeout);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST_P(transport_fault, a_send_to_a_stopped_peer_times_out) {
  // Issue 13, item 5: every send has a deadline. The stopped peer takes
  // nothing: once its ring or socket is full, the send waits until
  // send_timeout, then fails, and so does the channel.
  auto o = test::options_for(0, GetParam());
  o.framing.send_timeout = 300ms;
  endpoint a(o);
  pid_t pid = 0;
  auto ch = echo_peer(a, GetParam(), pid);
  ASSERT_EQ(0, ::kill(pid, SIGSTOP));
  auto big = at::zeros({8 << 20}, at::kFloat); // 32 MiB: more than any buffer
  transport_errc code = transport_errc::cancelled;
  for (int i = 0; i < 64 && code == transport_errc::cancelled; ++i) {
    try {
      ch->send(test::tensor_message(1, big));
    } catch (const transport_error& e) {
      code = e.code();
    }
  }
  EXPECT_EQ(code, transport_errc::timeout);
  EXPECT_EQ(error_of([&] { ch->recv(2, 5s); }), transport_errc::timeout);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

INSTANTIATE_TEST_SUITE_P(transport, transport_fault,
                         ::testing::ValuesIn(test::stream_backends),
                         [](const auto& info) { return info.param; });

// -- frames that are not what they claim ----------------------------------------

/// A framed channel on one end of a socket pair; the test writes raw bytes
/// into the other end.
struct raw_peer {
  raw_peer() {
    int fds[2];
    EXPECT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM, 0, fds));
    raw = fds[1];
    ch = std::make_unique<framed_channel>(
      std::make_unique<socket_link>(fds[0], "tcp", "raw peer"),
      framed_options{});
  }
  ~raw_peer() {
    ch.reset();
    ::close(raw);
  }
  void write(const void* data, std::size_t n) {
    ASSERT_EQ(static_cast<ssize_t>(n), ::write(raw, data, n));
  }
  /// The error of a receive (tag 1) that waits while `send` writes the
  /// raw end.
  template <class Send>
  transport_errc receive_error(Send&& send) {
    auto waiting = ch->recv_async(1);
    send();
    return error_of([&] { waiting.get(10s); });
  }
  int raw;
  std::unique_ptr<framed_channel> ch;
};

std::array<std::byte, wire::header_bytes> header_of(const wire::frame_header& h) {
  std::array<std::byte, wire::header_bytes> out;
  wire::encode(h, out.data());
  return out;
}

TEST(transport_frames, corrupt_header_fails_the_receive) {
  raw_peer p;
  wire::frame_header h;
  h.tag = 1;
  h.payload_bytes = 4;
  auto bytes = header_of(h);
  bytes[9] ^= std::byte{0x40}; // flip a bit of the tag: the CRC catches it
  EXPECT_EQ(p.receive_error([&] { p.write(bytes.data(), bytes.size()); }),
            transport_errc::corrupt_frame);
}

TEST(transport_frames, garbage_is_another_protocol) {
  raw_peer p;
  std::string garbage(wire::header_bytes, 'x');
  EXPECT_EQ(p.receive_error([&] { p.write(garbage.data(), garbage.size()); }),
            transport_errc::protocol_mismatch);
}

TEST(transport_frames, truncated_frame_fails_the_receive) {
  raw_peer p;
  wire::frame_header h;
  h.tag = 1;
  h.payload_bytes = 100;
  auto bytes = header_of(h);
  const auto error = p.receive_error([&] {
    p.write(bytes.data(), bytes.size());
    p.write("only ten b", 10);
    ::shutdown(p.raw, SHUT_WR);
  });
  EXPECT_EQ(error, transport_errc::corrupt_frame);
}

TEST(transport_frames, payload_checksum_is_verified) {
  raw_peer p;
  wire::frame_header h;
  h.tag = 1;
  h.payload_bytes = 4;
  h.flags = wire::flag::payload_crc;
  h.payload_crc = 12345; // not the CRC of "abcd"
  auto bytes = header_of(h);
  const auto error = p.receive_error([&] {
    p.write(bytes.data(), bytes.size());
    p.write("abcd", 4);
  });
  EXPECT_EQ(error, transport_errc::corrupt_frame);
}

TEST(transport_frames, tensor_shape_must_match_its_payload) {
  raw_peer p;
  wire::frame_header h;
  h.tag = 1;
  h.flags = wire::flag::tensor;
  h.dtype = wire::dtype_code::float32;
  h.ndim = 2;
  h.shape[0] = 1000;
  h.shape[1] = 1000; // 4 MB of floats
  h.payload_bytes = 16;
  auto bytes = header_of(h);
  EXPECT_EQ(p.receive_error([&] { p.write(bytes.data(), bytes.size()); }),
            transport_errc::corrupt_frame);
}

TEST(transport_frames, other_protocol_version_is_refused_by_the_dialer) {
  int fds[2];
  ASSERT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM, 0, fds));
  socket_link dialer(fds[0], "tcp", "fake acceptor");
  std::thread acceptor([raw = fds[1]] {
    std::byte challenge[wire::header_bytes + wire::hello_bytes];
    ::recv(raw, challenge, sizeof(challenge), MSG_WAITALL);
    wire::frame_header h;
    h.kind = wire::frame_kind::hello;
    h.payload_bytes = wire::hello_bytes;
    std::byte reply[wire::header_bytes] = {};
    wire::encode(h, reply);
    std::uint16_t future_version = wire::version + 1;
    std::memcpy(reply + 4, &future_version, 2);
    ::send(raw, reply, sizeof(reply), MSG_NOSIGNAL);
    ::close(raw);
  });
  job_secret secret("s");
  EXPECT_EQ(error_of([&] {
              dial_handshake(dialer, secret, 1, 0,
                             std::chrono::steady_clock::now() + 10s);
            }),
            transport_errc::protocol_mismatch);
  acceptor.join();
}

TEST(transport_frames, a_placed_payload_where_links_never_place_is_corrupt) {
  raw_peer p; // a socket link: payloads always follow their header
  wire::frame_header h;
  h.tag = 1;
  h.flags = wire::flag::tensor | wire::flag::placed;
  h.dtype = wire::dtype_code::float32;
  h.ndim = 1;
  h.shape[0] = 1 << 16;
  h.payload_bytes = 4 << 16;
  auto bytes = header_of(h);
  std::byte record[wire::placement_bytes];
  wire::encode(wire::placement{0, h.payload_bytes}, record);
  const auto error = p.receive_error([&] {
    p.write(bytes.data(), bytes.size());
    p.write(record, sizeof(record));
  });
  EXPECT_EQ(error, transport_errc::corrupt_frame);
}

TEST(transport_frames, placement_records_are_checked) {
  std::byte record[wire::placement_bytes];
  wire::encode(wire::placement{1 << 20, 4096}, record);
  auto back = wire::decode_placement(record, 4096);
  EXPECT_EQ(back.offset, 1u << 20);
  EXPECT_EQ(back.bytes, 4096u);
  // A record for another payload size is a corrupt frame.
  EXPECT_EQ(error_of([&] { wire::decode_placement(record, 4095); }),
            transport_errc::corrupt_frame);
  // Only tensors are placed.
  wire::frame_header h;
  h.flags = wire::flag::placed;
  h.payload_bytes = 4096;
  auto bytes = header_of(h);
  EXPECT_EQ(error_of([&] { wire::decode(bytes.data(), 1 << 20); }),
            transport_errc::corrupt_frame);
}

TEST(transport_frames, device_placements_are_placed_tensors_without_checksum) {
  wire::frame_header h;
  h.flags = wire::flag::tensor | wire::flag::placed | wire::flag::on_device;
  h.dtype = wire::dtype_code::float32;
  h.ndim = 1;
  h.shape[0] = 1024;
  h.payload_bytes = 4096;
  EXPECT_EQ(wire::decode(header_of(h).data(), 1 << 20).flags, h.flags);
  // Not placed: the bytes would have to follow, and they are the device's.
  h.flags = wire::flag::tensor | wire::flag::on_device;
  EXPECT_EQ(error_of([&] { wire::decode(header_of(h).data(), 1 << 20); }),
            transport_errc::corrupt_frame);
  // A checksum is the host's to compute: never over device memory.
  h.flags = wire::flag::tensor | wire::flag::placed | wire::flag::on_device |
            wire::flag::payload_crc;
  EXPECT_EQ(error_of([&] { wire::decode(header_of(h).data(), 1 << 20); }),
            transport_errc::corrupt_frame);
}

TEST(transport_frames, wire_header_round_trips) {
  wire::frame_header h;
  h.kind = wire::frame_kind::data;
  h.flags = wire::flag::tensor | wire::flag::payload_crc;
  h.tag = 0x123456789abcdefULL;
  h.virtual_clock = 1.5;
  h.wall_clock = -2.25; // another host behind the origin
  h.payload_bytes = 2 * 3 * 4 * 2;
  h.payload_crc = 77;
  h.dtype = wire::dtype_code::bfloat16;
  h.ndim = 3;
  h.shape = {2, 3, 4};
  auto bytes = header_of(h);
  auto back = wire::decode(bytes.data(), 1 << 20);
  EXPECT_EQ(back.tag, h.tag);
  EXPECT_EQ(back.virtual_clock, 1.5);
  EXPECT_EQ(back.wall_clock, -2.25);
  EXPECT_EQ(back.payload_crc, 77u);
  EXPECT_EQ(back.dtype, wire::dtype_code::bfloat16);
  EXPECT_EQ(back.ndim, 3);
  EXPECT_EQ(back.shape[2], 4);
  // A payload over the limit is refused before anything is allocated.
  EXPECT_THROW(wire::decode(bytes.data(), 10), transport_error);
}

// Found by fuzz_frame_decoder (fuzz/corpus/frame_decoder/
// byte-frame-with-a-shape-word): a header that decodes is one this build
// could have sent, so the shape words of a byte payload must be zero too.
TEST(transport_frames, a_byte_frame_with_a_shape_is_a_corrupt_frame) {
  wire::frame_header h;
  h.kind = wire::frame_kind::hello;
  h.payload_bytes = wire::hello_bytes;
  auto bytes = header_of(h);
  bytes[48 + 8 * 5 + 3] = std::byte{3}; // shape[5], beyond any ndim
  const std::uint32_t crc = crc32c(bytes.data(), 124);
  std::memcpy(bytes.data() + 124, &crc, sizeof(crc));
  EXPECT_EQ(error_of([&] { wire::decode(bytes.data(), 1 << 20); }),
            transport_errc::corrupt_frame);
}

// Issue 13, item 4: a peer's clock fields reach a chip's clock; one that is
// not a time since the run's origin is refused at the header.
TEST(transport_frames, a_forged_clock_field_is_a_corrupt_frame) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (bool virtual_field : {true, false}) {
    std::vector<double> bad = {nan,   inf,
                               -inf,  wire::max_clock_seconds,
                               1e300, -wire::max_clock_skew_seconds,
                               -1e9};
    if (virtual_field) // the virtual clock starts at the origin
      bad.insert(bad.end(), {-1e-9, -5.0});
    for (double value : bad) {
      wire::frame_header h;
      h.kind = wire::frame_kind::data;
      (virtual_field ? h.virtual_clock : h.wall_clock) = value;
      auto bytes = header_of(h);
      try {
        wire::decode(bytes.data(), 1 << 20);
        ADD_FAILURE() << "accepted a clock of " << value;
      } catch (const transport_error& e) {
        EXPECT_EQ(e.code(), transport_errc::corrupt_frame);
        EXPECT_NE(std::string(e.what()).find(virtual_field ? "virtual clock"
                                                           : "wall clock"),
                  std::string::npos)
          << e.what();
      }
    }
  }
  wire::frame_header ok; // a host 5 s behind the origin is skew, not forgery
  ok.virtual_clock = wire::max_clock_seconds / 2;
  ok.wall_clock = -5;
  auto bytes = header_of(ok);
  const auto back = wire::decode(bytes.data(), 1 << 20);
  EXPECT_EQ(back.virtual_clock, ok.virtual_clock);
  EXPECT_EQ(back.wall_clock, -5);
}

/// Resident memory of this process, bytes (/proc/self/statm).
std::uint64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

// Issue 13, item 3: what a peer's header makes the receiver allocate.
TEST(transport_frames, a_payload_over_the_plan_bound_is_a_corrupt_frame) {
  raw_peer p;
  p.ch->set_limits({1 << 20, 16});
  wire::frame_header h;
  h.tag = 1;
  h.payload_bytes = (1 << 20) + 1;
  auto bytes = header_of(h);
  EXPECT_EQ(p.receive_error([&] { p.write(bytes.data(), bytes.size()); }),
            transport_errc::corrupt_frame);

  raw_peer q; // the bound is the receiver's, set again when the plan changes
  q.ch->set_limits({1 << 20, 16});
  q.ch->set_limits({4 << 20, 16});
  auto waiting = q.ch->recv_async(1);
  q.write(bytes.data(), bytes.size());
  std::vector<char> payload(h.payload_bytes, 'x');
  q.write(payload.data(), payload.size());
  EXPECT_EQ(waiting.get(10s).bytes.size(), h.payload_bytes);
}

TEST(transport_frames, messages_nobody_waits_for_are_bounded) {
  raw_peer p;
  p.ch->set_limits({1 << 20, 4});
  auto frame = [](std::uint64_t tag) {
    wire::frame_header h;
    h.tag = tag;
    h.payload_bytes = 3;
    auto bytes = header_of(h);
    std::string out(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    return out + "abc";
  };
  // Four queued messages are fine: a receive of one of them takes it.
  for (std::uint64_t tag = 2; tag < 6; ++tag) {
    auto f = frame(tag);
    p.write(f.data(), f.size());
  }
  EXPECT_EQ(text_of(p.ch->recv(3, 10s)), "abc");
  // Two more pass the bound (4 queued again, then a fifth): the channel
  // fails, and a waiting receive learns why.
  EXPECT_EQ(p.receive_error([&] {
    for (std::uint64_t tag : {6, 7}) {
      auto f = frame(tag);
      p.write(f.data(), f.size());
    }
  }),
            transport_errc::corrupt_frame);
}

TEST(transport_frames, a_byte_payload_is_not_allocated_before_it_arrives) {
  raw_peer p;
  p.ch->set_limits({std::uint64_t{4} << 30, 16});
  const std::uint64_t before = resident_bytes();
  wire::frame_header h;
  h.tag = 1;
  h.payload_bytes = std::uint64_t{1} << 30; // announced, never sent
  auto bytes = header_of(h);
  auto waiting = p.ch->recv_async(1);
  p.write(bytes.data(), bytes.size());
  p.write("a few bytes", 11);
  EXPECT_EQ(error_of([&] { waiting.get(300ms); }), transport_errc::timeout);
  // Zero-filled, the gigabyte would be resident now.
  EXPECT_LT(resident_bytes(), before + (std::uint64_t{256} << 20));
}

TEST(transport_frames, dtype_codes_round_trip_with_their_element_sizes) {
  for (auto type : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong, at::kInt,
                    at::kByte, at::kDouble}) {
    auto code = wire::code_of(type);
    EXPECT_EQ(wire::scalar_type_of(code), type) << c10::toString(type);
    EXPECT_EQ(wire::element_size(code), c10::elementSize(type))
      << c10::toString(type);
  }
  // A type the wire does not carry is refused at the send, by name.
  try {
    wire::code_of(at::kComplexFloat);
    ADD_FAILURE() << "complex tensors have no wire code";
  } catch (const internal_error& e) {
    EXPECT_NE(std::string(e.what()).find("ComplexFloat"), std::string::npos)
      << e.what();
  }
}

} // namespace
} // namespace h2::transport
