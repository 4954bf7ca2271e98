#include "verbs.hpp"

#include "h2/core/error.hpp"
#include "h2/core/random.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace h2::transport::rdma {

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

[[noreturn]] void fail_setup(const std::string& what) {
  throw transport_error(transport_errc::peer_closed, "rdma: " + what);
}

region::region(std::size_t bytes) : bytes_(bytes) {
  data_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data_ == MAP_FAILED) {
    data_ = nullptr;
    fail_setup(errno_text("mmap of a ring"));
  }
}

region::~region() {
  if (data_ != nullptr)
    ::munmap(data_, bytes_);
}

fd_guard::~fd_guard() {
  if (fd_ >= 0)
    ::close(fd_);
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    fail_setup(errno_text("fcntl"));
}

void put(std::byte* out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out[i] = static_cast<std::byte>(v >> (8 * i));
}

std::uint64_t get(const std::byte* in, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<std::uint64_t>(in[i]) << (8 * i);
  return v;
}

namespace {

void check_record(const std::byte* in, const std::string& peer) {
  if (get(in, 4) != record_magic)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: rdma peer " + peer +
                            " sent no queue-pair setup");
  if (get(in + 4, 2) != record_version)
    throw transport_error(transport_errc::protocol_mismatch,
                          "rdma peer " + peer +
                            " speaks another queue-pair setup version");
}

} // namespace

void send_offer(socket_link& s, const offer& o, deadline until) {
  std::byte b[offer_bytes] = {};
  put(b, record_magic, 4);
  put(b + 4, record_version, 2);
  put(b + 6, o.cm_port, 2);
  put(b + 8, o.token, 8);
  s.write({{b, sizeof(b)}}, until);
}

offer receive_offer(socket_link& s, deadline until) {
  std::byte b[offer_bytes];
  s.read(b, sizeof(b), until);
  check_record(b, s.peer());
  return {get(b + 8, 8), static_cast<std::uint16_t>(get(b + 6, 2))};
}

void send_ring(socket_link& s, const ring_info& r, deadline until) {
  std::byte b[ring_info_bytes] = {};
  put(b, record_magic, 4);
  put(b + 4, record_version, 2);
  put(b + 8, r.address, 8);
  put(b + 16, r.rkey, 4);
  put(b + 24, r.capacity, 8);
  s.write({{b, sizeof(b)}}, until);
}

ring_info receive_ring(socket_link& s, deadline until) {
  std::byte b[ring_info_bytes];
  s.read(b, sizeof(b), until);
  check_record(b, s.peer());
  ring_info r{get(b + 8, 8), static_cast<std::uint32_t>(get(b + 16, 4)),
              get(b + 24, 8)};
  if (r.capacity < min_ring_bytes || r.capacity > max_ring_bytes)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: rdma peer " + s.peer() +
                            " offers a ring of " + std::to_string(r.capacity) +
                            " bytes");
  return r;
}

std::uint64_t random_token() {
  std::uint64_t t = 0;
  random_bytes(&t, sizeof(t));
  return t;
}

std::pair<rdma_cm_event_type, int> next_event(rdma_event_channel* channel,
                                              deadline until,
                                              const std::string& where) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(channel, &ev) == 0) {
      auto out = std::make_pair(ev->event, ev->status);
      rdma_ack_cm_event(ev);
      return out;
    }
    if (errno != EAGAIN && errno != EINTR)
      fail_setup(where + ": " + errno_text("rdma_get_cm_event"));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      until - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      throw transport_error(transport_errc::timeout,
                            "rdma: " + where + ": no answer in time");
    pollfd pfd{channel->fd, POLLIN, 0};
    ::poll(&pfd, 1, static_cast<int>(std::min<long long>(left.count(), 100)));
  }
}

void expect_event(rdma_event_channel* channel, rdma_cm_event_type expected,
                  deadline until, const std::string& where) {
  auto [type, status] = next_event(channel, until, where);
  if (type != expected)
    fail_setup(where + ": " + rdma_event_str(type) + " (status " +
               std::to_string(status) + "), expected " +
               rdma_event_str(expected));
}

rdma_event_channel* new_event_channel() {
  rdma_event_channel* ch = rdma_create_event_channel();
  if (ch == nullptr)
    fail_setup(errno_text("rdma_create_event_channel"));
  return ch;
}

} // namespace h2::transport::rdma
