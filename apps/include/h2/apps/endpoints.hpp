// What a run serves over HTTP (docs/metrics.md, docs/admin.md): Prometheus
// metrics, the admin API and the live page, on one listener when
// metrics.port and admin.port are the same (and so are their binds), else
// on two. The admin listener has the admin endpoint's TLS; so does the
// shared one, /metrics included.
#pragma once

#include "h2/apps/admin_api.hpp"
#include "h2/apps/run_flags.hpp"
#include "h2/core/job.hpp"
#include "h2/metrics/http_server.hpp"
#include "h2/metrics/registry.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/runtime/run_view.hpp"

#include <memory>
#include <string>

namespace h2::apps {

struct endpoint_options {
  /// Added to metrics.port (0 stays 0: any free port): a node's rank, so
  /// the nodes of one host do not collide.
  int port_offset = 0;
  /// This process takes admin commands (h2-launch, the coordinator's node)
  /// when the job's [admin] or --admin-port asks for an endpoint.
  bool admin = true;
  /// The live page's state (the coordinator's process); null: no page.
  /// Must outlive the endpoints.
  const runtime::run_view* page = nullptr;
};

class run_endpoints {
public:
  /// Listens where the job and the flags say, and prints where. Throws
  /// config_error naming metrics.port or admin.port when a port is taken,
  /// admin.token_file or admin.certificate when those do not load.
  run_endpoints(const job_config& job, const run_flags& flags,
                const endpoint_options& options, const std::string& program);

  run_endpoints(const run_endpoints&) = delete;
  run_endpoints& operator=(const run_endpoints&) = delete;

  /// The registry to fill, or nullptr when no metrics are served.
  metrics::registry* registry() noexcept {
    return serves_metrics_ ? &registry_ : nullptr;
  }

  /// Where the run takes admin commands from; null when none is served.
  std::shared_ptr<runtime::admin_inbox> inbox() const { return inbox_; }

  /// The ports served on; 0 for none (the same port when shared).
  int metrics_port() const noexcept;
  int admin_port() const noexcept;

private:
  metrics::registry registry_;
  bool serves_metrics_ = false;
  std::shared_ptr<runtime::admin_inbox> inbox_;
  std::unique_ptr<admin_api> admin_;
  /// Last, so they stop before what their routes refer to. The metrics
  /// listener is null when the admin listener serves /metrics too.
  std::unique_ptr<metrics::http_server> metrics_server_;
  std::unique_ptr<metrics::http_server> admin_server_;
};

} // namespace h2::apps
