// A byte_link over a connected stream socket (TCP or Unix domain): what the
// tcp backend carries data on, and what the shm and rdma backends bootstrap
// over (handshake, then their own link); and the listener that accepts such
// sockets for tcp and shm (docs/transport.md, File layout).
#pragma once

#include "h2/transport/link.hpp"
#include "h2/transport/report.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <sys/socket.h>
#include <thread>

namespace h2::transport {

class socket_link final : public byte_link {
public:
  /// Takes ownership of the connected socket `fd`. Never throws: the
  /// eventfds that waits sleep on are made by the first wait (links that
  /// only bootstrap another never make them).
  socket_link(int fd, std::string backend, std::string peer);
  ~socket_link() override;

  /// sendmsg(2) that does not wait; poll(2) for room up to `until`.
  void write(std::initializer_list<buffer_view> parts, deadline until) override;
  /// recv(2) that does not wait.
  std::size_t read_some(void* data, std::size_t size) override;
  std::uint32_t wake_count() const noexcept override;
  /// poll(2) on the socket and on an eventfd that nudge() writes.
  void wait_readable(std::uint32_t seen, deadline until) override;
  void nudge() noexcept override;
  /// As wait_readable(), on an eventfd of its own, for at most
  /// drain_interval: the socket itself tells of a dead peer.
  void wait_drain(std::uint32_t seen) override;
  /// 64 KiB: each read is a system call.
  std::size_t read_ahead_bytes() const noexcept override { return 64 << 10; }
  void shutdown() noexcept override;
  std::string_view backend() const noexcept override { return backend_; }
  std::string peer() const override { return peer_; }

  int fd() const noexcept { return fd_; }

  /// True when the peer closed its end (non-blocking check; data still
  /// unread counts as alive).
  bool peer_gone() const noexcept;

  /// The longest wait_drain().
  static constexpr std::chrono::seconds drain_interval{1};

private:
  /// Where one kind of waiter (wait_readable's, wait_drain's) sleeps: on
  /// the socket and on an eventfd of its own, which nudge() writes while
  /// the waiter is counted. One thread at a time per kind, so whoever
  /// empties the eventfd after waking is the one it was written for.
  struct sleep_place {
    int wake_fd = -1; ///< set once, by make_wake_fds()
    std::atomic<int> sleeping{0};
  };

  /// Makes both places' eventfds, once. Throws transport_error
  /// (peer_closed) when the process is out of descriptors.
  void make_wake_fds();

  /// Sleeps in `place` until the socket is readable (bytes or its end),
  /// the count moved past `seen`, or `until`; false at `until`. Throws
  /// transport_error: cancelled after shutdown().
  bool sleep(sleep_place& place, std::uint32_t seen, deadline until);

  [[noreturn]] void fail(int err, const char* what) const;

  int fd_;
  std::string backend_;
  std::string peer_;
  std::atomic<bool> shut_{false};
  std::atomic<std::uint32_t> wakes_{0}; ///< nudge()s so far
  sleep_place receive_;                  ///< wait_readable()
  sleep_place drain_;                    ///< wait_drain()
  std::once_flag wake_fds_made_;
};

/// "host:port" of a connected socket's peer (or "unix:<name>").
std::string describe_peer(int fd);

/// The socket address of IP literal `host` ("10.0.0.2", "::1") and `port`.
/// Throws config_error (key transport.bind) when `host` is no IP address.
sockaddr_storage ip_address(const std::string& host, std::uint16_t port);

/// Accepts connections on a bound, listening socket, on a thread of its own,
/// until stop(). A failed accept that is not the listener's end (out of file
/// descriptors, EMFILE; out of memory) is retried after retry_delay, so the
/// thread never spins; so is a connection whose link cannot be made or
/// delivered (an exception from the callbacks), which is dropped. Both are
/// reported to the log sink, at most one line per 10 s.
class socket_listener {
public:
  /// Makes the link of an accepted socket `fd` (which it then owns), or
  /// returns null to refuse the connection (having closed `fd`): a peer of
  /// another user on the shm rendezvous socket.
  using make_link = std::function<std::unique_ptr<byte_link>(int fd)>;
  /// Called on the listener's thread with each accepted connection.
  using on_connection = std::function<void(std::unique_ptr<byte_link>)>;

  /// The pause after a failed accept.
  static constexpr std::chrono::milliseconds retry_delay{50};

  /// Takes ownership of `fd`, bound and listening.
  explicit socket_listener(int fd) noexcept : fd_(fd) {}
  ~socket_listener();

  socket_listener(const socket_listener&) = delete;
  socket_listener& operator=(const socket_listener&) = delete;

  /// Starts the accepting thread. Call once. `log` hears of failed accepts
  /// (`what` names the listener in its lines: "tcp 10.0.0.2:4000").
  void start(make_link make, on_connection deliver, std::string what = {},
             log_sink log = {});

  /// Wakes and joins the accepting thread; closes the socket. Idempotent;
  /// not concurrently with start().
  void stop() noexcept;

  int fd() const noexcept { return fd_; }

  /// Accepts that failed and were retried after retry_delay.
  std::uint64_t failed_accepts() const noexcept { return failed_.load(); }

private:
  int fd_;
  std::atomic<bool> stopped_{false};
  std::atomic<std::uint64_t> failed_{0};
  std::thread thread_;
};

} // namespace h2::transport
