// The admin endpoint (docs/admin.md): a TCP listener that takes one sealed
// request per connection (runtime/admin.hpp), checks its MAC under the
// admin token and its sequence number, and hands the command to the
// running job's scheduler (runtime::admin_inbox). Served by h2-launch and
// by the coordinator's node of h2-node. One thread, one connection at a
// time: a client has request_timeout to send its line, so a silent or slow
// one delays the next by at most that; refused requests get an error line
// and a log line, and never reach the job.
#pragma once

#include "h2/core/job.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/transport/handshake.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

namespace h2::apps {

class admin_server {
public:
  /// Time a client has to send its request line, and to read the answer.
  static constexpr std::chrono::seconds request_timeout{5};

  /// Listens on config.bind:config.port (0: an ephemeral port, see port())
  /// and serves on a thread of its own. Throws h2::error("cannot listen on
  /// ...") when it cannot.
  admin_server(const admin_config& config,
               std::shared_ptr<const transport::job_secret> token,
               std::shared_ptr<runtime::admin_inbox> inbox,
               std::FILE* log = stderr);
  ~admin_server();

  admin_server(const admin_server&) = delete;
  admin_server& operator=(const admin_server&) = delete;

  std::uint16_t port() const noexcept { return port_; }

private:
  void serve();
  void handle(int fd, const std::string& peer);

  std::shared_ptr<const transport::job_secret> token_;
  std::shared_ptr<runtime::admin_inbox> inbox_;
  std::FILE* log_;
  transport::control_verifier verifier_;
  /// This process's session: the seals of requests to another run of the
  /// job (a restart, a resume) do not verify here.
  std::string session_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

} // namespace h2::apps
