// A byte_link over a connected stream socket (TCP or Unix domain): what the
// tcp backend carries data on, and what the shm and rdma backends bootstrap
// over (handshake, then their own link).
#pragma once

#include "h2/transport/framed.hpp"

#include <atomic>
#include <string>

namespace h2::transport {

class socket_link final : public byte_link {
public:
  /// Takes ownership of the connected socket `fd`.
  socket_link(int fd, std::string backend, std::string peer);
  ~socket_link() override;

  void write(std::initializer_list<buffer_view> parts) override;
  void read(void* data, std::size_t size,
            std::optional<deadline> until = std::nullopt) override;
  void shutdown() noexcept override;
  std::string_view backend() const noexcept override { return backend_; }
  std::string peer() const override { return peer_; }

  int fd() const noexcept { return fd_; }

  /// True when the peer closed its end (non-blocking check; data still
  /// unread counts as alive).
  bool peer_gone() const noexcept;

private:
  [[noreturn]] void fail(int err, const char* what) const;

  int fd_;
  std::string backend_;
  std::string peer_;
  std::atomic<bool> shut_{false};
};

/// "host:port" of a connected socket's peer (or "unix:<name>").
std::string describe_peer(int fd);

} // namespace h2::transport
