// What the shm backend promises beyond the conformance suite: tensors of
// 64 KiB and more are copied once, into the shared segment, and received
// as views of it; blocks the receiver still holds are never reused; a full
// heap falls back to streaming; received tensors outlive their channel.
#include "pairs.hpp"

#include "h2/core/error.hpp"
#include "h2/core/random.hpp"
#include "h2/transport/channel.hpp"
#include "h2/transport/socket_link.hpp"
// The segment's layout, for a hostile acceptor that passes a bad one, and
// its link, for a hostile writer.
#include "../../transport/shm/link.hpp"
#include "../../transport/shm/segment.hpp"
#include "h2/transport/framed.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <vector>

namespace h2::transport {
namespace {

using namespace std::chrono_literals;

using test::patience;

/// Whether `p` lies in a mapping of an h2 shm segment (a memfd named
/// "h2-shm"), by /proc/self/maps.
bool in_shm_segment(const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:h2-shm") == std::string::npos)
      continue;
    std::istringstream in(line);
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    in >> std::hex >> lo >> dash >> hi;
    if (at >= lo && at < hi)
      return true;
  }
  return false;
}

using test::tensor_message;

/// A float tensor of `n` elements counting from `from`.
at::Tensor counting(std::int64_t n, float from) {
  return at::arange(from, from + static_cast<float>(n), at::kFloat);
}

test::channel_pair shm_pair(std::uint64_t heap_bytes) {
  return test::make_pair_over(
    "shm", [&](endpoint_options& o) { o.shm_heap_bytes = heap_bytes; });
}

TEST(transport_shm, large_tensors_are_received_in_the_segment) {
  auto [a, b] = shm_pair(std::uint64_t{16} << 20);
  auto sent = counting(1 << 18, 1); // 1 MiB
  a->send(tensor_message(3, sent));
  auto got = b->recv(3, patience).tensor;
  EXPECT_TRUE(in_shm_segment(got.data_ptr()));
  EXPECT_TRUE(at::equal(got, sent));
  // Small payloads stream through the ring into ordinary memory.
  a->send(tensor_message(3, counting(16, 5)));
  auto small = b->recv(3, patience).tensor;
  EXPECT_FALSE(in_shm_segment(small.data_ptr()));
  EXPECT_TRUE(at::equal(small, counting(16, 5)));
}

TEST(transport_shm, no_heap_streams_every_payload) {
  auto [a, b] = shm_pair(0);
  a->send(tensor_message(3, counting(1 << 18, 2)));
  auto got = b->recv(3, patience).tensor;
  EXPECT_FALSE(in_shm_segment(got.data_ptr()));
  EXPECT_TRUE(at::equal(got, counting(1 << 18, 2)));
}

TEST(transport_shm, held_blocks_are_kept_and_a_full_heap_streams) {
  // A heap of four 256 KiB blocks; the receiver holds all it gets.
  auto [a, b] = shm_pair(std::uint64_t{1} << 20);
  constexpr int n = 10;
  constexpr std::int64_t elements = 1 << 16; // 256 KiB
  std::vector<at::Tensor> held;
  for (int i = 0; i < n; ++i) {
    a->send(tensor_message(4, counting(elements, static_cast<float>(i))));
    held.push_back(b->recv(4, patience).tensor);
  }
  int placed = 0;
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    placed += in_shm_segment(held[i].data_ptr()) ? 1 : 0;
    // None was overwritten by a later message.
    EXPECT_TRUE(at::equal(held[i], counting(elements, static_cast<float>(i))));
  }
  EXPECT_EQ(placed, 4);
  // Freed blocks are placed in again.
  held.clear();
  for (int i = 0; i < n; ++i) {
    a->send(tensor_message(4, counting(elements, 100.0f + i)));
    auto got = b->recv(4, patience).tensor;
    EXPECT_TRUE(in_shm_segment(got.data_ptr())) << i;
    EXPECT_TRUE(at::equal(got, counting(elements, 100.0f + i)));
  }
}

TEST(transport_shm, device_sharing_leaves_host_tensors_in_the_segment) {
  auto [a, b] = shm_pair(std::uint64_t{16} << 20);
  a->share_device_memory(0); // as between two CUDA chips
  auto sent = counting(1 << 18, 3);
  a->send(tensor_message(3, sent));
  auto got = b->recv(3, patience).tensor;
  EXPECT_TRUE(in_shm_segment(got.data_ptr()));
  EXPECT_TRUE(at::equal(got, sent));
  EXPECT_EQ(a->stats().bytes_sent, std::uint64_t{1} << 20);
  EXPECT_EQ(a->stats().bytes_sent_on_device, 0u);
}

TEST(transport_shm, received_tensors_outlive_their_channel) {
  at::Tensor got;
  {
    auto [a, b] = shm_pair(std::uint64_t{4} << 20);
    a->send(tensor_message(1, counting(1 << 17, 9)));
    got = b->recv(1, patience).tensor;
    ASSERT_TRUE(in_shm_segment(got.data_ptr()));
  }
  // Both ends are gone; the segment stays mapped while the tensor lives.
  EXPECT_TRUE(in_shm_segment(got.data_ptr()));
  EXPECT_TRUE(at::equal(got, counting(1 << 17, 9)));
  got = at::Tensor();
}

TEST(transport_shm, bad_sizes_name_their_job_key) {
  auto o = test::options_for(0, "shm");
  o.shm_ring_bytes = 0;
  try {
    endpoint e(o);
    ADD_FAILURE() << "a ring of 0 bytes was accepted";
  } catch (const config_error& e) {
    EXPECT_EQ(e.key_path(), "transport.shm_ring_mb") << e.what();
  }
  o = test::options_for(0, "shm");
  o.shm_heap_bytes = std::uint64_t{1} << 41;
  try {
    endpoint e(o);
    ADD_FAILURE() << "a heap of 2 TiB was accepted";
  } catch (const config_error& e) {
    EXPECT_EQ(e.key_path(), "transport.shm_heap_mb") << e.what();
  }
}

/// A hostile shm acceptor: passes the secret's handshake, then passes a
/// segment of `sizes` made by `make_fd` instead of a sealed one of its size.
/// Returns what the dialer's dial() throws.
transport_errc dial_a_hostile_acceptor(const std::function<int()>& make_fd,
                                       shm::segment_sizes sizes) {
  const std::string name = "h2-shm-hostile-" + random_hex(8);
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  auto len =
    static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(::listen(listener, 1), 0);
  auto acceptor = std::async(std::launch::async, [&] {
    socket_link link(::accept(listener, nullptr, nullptr), "shm", "dialer");
    auto until = std::chrono::steady_clock::now() + patience;
    accept_handshake(link, *test::test_secret(), 1, until);
    int fd = make_fd();
    shm::send_fd(link.fd(), fd, sizes);
    ::close(fd);
    // Hold the connection until the dialer gave up on it.
    char c = 0;
    [[maybe_unused]] const auto n = ::recv(link.fd(), &c, 1, 0);
  });
  endpoint dialer(test::options_for(0, "shm"));
  endpoint_address peer;
  peer.node_rank = 1;
  peer.host_id = this_host_id();
  peer.shm_socket = name;
  auto code = test::error_of([&] {
    dialer.dial(peer, 3, "shm", std::chrono::steady_clock::now() + patience);
  });
  acceptor.get();
  ::close(listener);
  return code;
}

TEST(transport_shm,
     a_peer_segment_not_sealed_or_not_its_claimed_size_is_refused) {
  shm::segment_sizes sizes{std::uint64_t{1} << 20, 0};
  auto memfd = [&](unsigned flags, std::uint64_t bytes, int seals) {
    return [=] {
      int fd = ::memfd_create("h2-shm-hostile", MFD_CLOEXEC | flags);
      EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
      if (seals != 0) {
        EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, seals), 0);
      }
      return fd;
    };
  };
  const int both = F_SEAL_SHRINK | F_SEAL_GROW;
  // Unsealed: it could shrink under the dialer's mapping later (SIGBUS).
  EXPECT_EQ(dial_a_hostile_acceptor(memfd(0, sizes.total(), 0), sizes),
            transport_errc::corrupt_frame);
  // Sealed against growing only.
  EXPECT_EQ(dial_a_hostile_acceptor(
              memfd(MFD_ALLOW_SEALING, sizes.total(), F_SEAL_GROW), sizes),
            transport_errc::corrupt_frame);
  // Sealed, but smaller than the sizes it claims.
  EXPECT_EQ(dial_a_hostile_acceptor(
              memfd(MFD_ALLOW_SEALING, sizes.total() / 2, both), sizes),
            transport_errc::corrupt_frame);
  // Sealed at its size, but sizes this backend never makes.
  shm::segment_sizes odd{std::uint64_t{1} << 20, 1000};
  EXPECT_EQ(
    dial_a_hostile_acceptor(memfd(MFD_ALLOW_SEALING, odd.total(), both), odd),
    transport_errc::corrupt_frame);
}

/// One shm segment with both of its ends in this process, and no backend: a
/// framed channel receives on the dialer's end while a test writes what a
/// hostile acceptor would on the other.
struct raw_shm_writer {
  shm::segment_sizes sizes{std::uint64_t{1} << 20, std::uint64_t{1} << 20};
  std::shared_ptr<shm::segment> seg = std::make_shared<shm::segment>();
  shm::segment_header* header = nullptr;
  std::unique_ptr<shm::shm_link> writer;
  std::unique_ptr<framed_channel> reader;

  raw_shm_writer() {
    seg->bytes = sizes.total();
    seg->map = ::mmap(nullptr, seg->bytes, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(seg->map, MAP_FAILED);
    header = new (seg->map) shm::segment_header{shm::segment_magic, sizes, {}};
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    writer = std::make_unique<shm::shm_link>(
      seg, true, std::make_unique<socket_link>(fds[0], "shm", "reader"));
    reader = std::make_unique<framed_channel>(
      std::make_unique<shm::shm_link>(
        seg, false, std::make_unique<socket_link>(fds[1], "shm", "writer")),
      framed_options{});
  }

  /// Publishes device memory of `bytes` on GPU `bus_id` as the writer's,
  /// sharing nothing (the handle is no allocation's).
  void claim_device_memory(std::uint64_t bytes, const char* bus_id) {
    shm::ring_control& out = header->rings[0];
    out.device_bytes = bytes;
    std::strcpy(out.device_bus_id, bus_id);
    out.device_state.store(1);
  }

  /// Sends a 64 KiB float tensor "placed" at `offset` of the writer's
  /// device memory; returns what the receive fails with.
  transport_error receive_a_device_placement(std::uint64_t offset) {
    wire::frame_header h;
    h.tag = 1;
    h.flags = wire::flag::tensor | wire::flag::placed | wire::flag::on_device;
    h.dtype = wire::dtype_code::float32;
    h.ndim = 1;
    h.shape[0] = 1 << 14;
    h.payload_bytes = 1 << 16;
    std::byte bytes[wire::header_bytes];
    wire::encode(h, bytes);
    std::byte record[wire::placement_bytes];
    wire::encode(wire::placement{offset, h.payload_bytes}, record);
    writer->write({{bytes, sizeof(bytes)}, {record, sizeof(record)}},
                  std::chrono::steady_clock::now() + patience);
    try {
      reader->recv(1, patience);
    } catch (const transport_error& e) {
      return e;
    }
    ADD_FAILURE() << "a hostile device placement was received";
    return transport_error(transport_errc::timeout, "");
  }
};

TEST(transport_shm, a_device_placement_the_peer_never_shared_is_corrupt) {
  raw_shm_writer w;
  const auto e = w.receive_a_device_placement(0);
  EXPECT_EQ(e.code(), transport_errc::corrupt_frame) << e.what();
  EXPECT_NE(std::string(e.what()).find("device memory it never shared"),
            std::string::npos)
    << e.what();
}

TEST(transport_shm, shared_device_memory_of_another_size_is_corrupt) {
  raw_shm_writer w;
  w.claim_device_memory(w.sizes.heap_bytes * 2, "0000:3b:00.0");
  const auto e = w.receive_a_device_placement(0);
  EXPECT_EQ(e.code(), transport_errc::corrupt_frame) << e.what();
}

TEST(transport_shm, a_device_placement_outside_the_shared_memory_is_corrupt) {
  raw_shm_writer w;
  w.claim_device_memory(w.sizes.heap_bytes, "0000:3b:00.0");
  const auto e = w.receive_a_device_placement(w.sizes.heap_bytes);
  EXPECT_EQ(e.code(), transport_errc::corrupt_frame) << e.what();
  EXPECT_NE(std::string(e.what()).find("of device memory of 1048576 bytes"),
            std::string::npos)
    << e.what();
}

TEST(transport_shm, device_memory_this_process_cannot_map_names_the_job_key) {
  raw_shm_writer w;
  w.claim_device_memory(w.sizes.heap_bytes, "ffff:ff:1f.7"); // no GPU's
  const auto e = w.receive_a_device_placement(0);
  EXPECT_EQ(e.code(), transport_errc::protocol_mismatch) << e.what();
  EXPECT_NE(std::string(e.what()).find("transport.cuda_ipc = false"),
            std::string::npos)
    << e.what();
}

} // namespace
} // namespace h2::transport
