// The admin API (docs/admin.md), a route of H2's HTTP server
// (metrics/http_server.hpp; apps/endpoints.hpp places it): `POST /admin`
// takes one sealed request (runtime/admin.hpp) as its body, checks its MAC
// under the admin token, its session and its sequence number, and hands
// the command to the running job's scheduler (runtime::admin_inbox); the
// answer is the body of the response. Served by h2-launch and by the
// coordinator's node of h2-node. Connections are served at once (up to
// http_server::max_connections), so silent clients keep no one else out;
// commands are answered one at a time on the server's worker thread.
// Refused requests get an error answer and a log line, and never reach the
// job.
#pragma once

#include "h2/core/job.hpp"
#include "h2/metrics/http_server.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/transport/handshake.hpp"

#include <cstdio>
#include <memory>
#include <string>

namespace h2::apps {

class admin_api {
public:
  /// Commands go to `inbox`; refusals and commands are logged to `log`.
  admin_api(std::shared_ptr<const transport::job_secret> token,
            std::shared_ptr<runtime::admin_inbox> inbox,
            std::FILE* log = stderr);

  admin_api(const admin_api&) = delete;
  admin_api& operator=(const admin_api&) = delete;

  /// `POST /admin`, blocking (it waits for the scheduler's answer). The
  /// route refers to this object, which must outlive every server serving
  /// it.
  metrics::http_route route();

private:
  /// One POST /admin, on the server's worker thread.
  metrics::http_answer handle(const metrics::http_call& call);
  metrics::http_answer refuse(int status, const std::string& peer,
                              const std::string& message);

  std::shared_ptr<const transport::job_secret> token_;
  std::shared_ptr<runtime::admin_inbox> inbox_;
  std::FILE* log_;
  transport::control_verifier verifier_;
  /// This process's session: the seals of requests to another run of the
  /// job (a restart, a resume) do not verify here.
  std::string session_;
};

} // namespace h2::apps
