#include "h2/apps/endpoints.hpp"

#include "h2/apps/live_page.hpp"
#include "h2/core/error.hpp"

#include <iostream>
#include <optional>
#include <vector>

namespace h2::apps {

namespace {

/// The TLS of the admin endpoint, loaded once to name the key that fails.
std::optional<metrics::http_tls> admin_tls(const admin_config& a) {
  if (a.certificate.empty())
    return std::nullopt;
  metrics::http_tls tls{a.certificate, a.key, a.client_ca};
  try {
    metrics::check_tls(tls);
  } catch (const h2::error& e) {
    throw config_error("admin.certificate", e.what());
  }
  return tls;
}

std::unique_ptr<metrics::http_server>
listen(const std::string& bind, int port, std::vector<metrics::http_route> r,
       std::optional<metrics::http_tls> tls, const std::string& key,
       const std::string& flag) {
  try {
    return std::make_unique<metrics::http_server>(
      bind, static_cast<std::uint16_t>(port), std::move(r), std::move(tls));
  } catch (const h2::error& e) {
    throw config_error(key, std::string(e.what()) + " (choose another with " +
                              flag + ")");
  }
}

void append(std::vector<metrics::http_route>& to,
            std::vector<metrics::http_route> routes) {
  for (auto& r : routes)
    to.push_back(std::move(r));
}

} // namespace

run_endpoints::run_endpoints(const job_config& job, const run_flags& flags,
                             const endpoint_options& options,
                             const std::string& program) {
  // --metrics-port names the port itself; the job's port is per node.
  int mport = flags.metrics_port >= 0 ? flags.metrics_port : job.metrics.port;
  serves_metrics_ = !flags.no_metrics && (flags.metrics_port >= 0 || mport > 0);
  if (flags.metrics_port < 0 && mport > 0)
    mport += options.port_offset;
  const int aport = flags.admin_port >= 0 ? flags.admin_port : job.admin.port;
  const bool serves_admin =
    options.admin && (flags.admin_port >= 0 || aport != 0);
  const bool shared = serves_metrics_ && serves_admin && mport == aport &&
                      mport > 0 && job.metrics.bind == job.admin.bind;
  const auto& page = job.admin.page;
  // (load_job refuses "token" without an admin endpoint.)
  const bool has_page = options.page != nullptr && page != "off";

  std::shared_ptr<const transport::job_secret> token;
  std::optional<std::string> page_token; // page = "token"
  std::optional<metrics::http_tls> tls;
  std::vector<metrics::http_route> admin_routes;
  if (serves_admin) {
    if (job.admin.token_file.empty())
      throw config_error("admin.token_file",
                         "missing: the admin endpoint needs a token file "
                         "(docs/admin.md)");
    token = runtime::load_admin_token(job.admin.token_file);
    if (page == "token")
      page_token = transport::read_token_file(
        job.admin.token_file, "admin.token_file", "the admin token");
    tls = admin_tls(job.admin);
    inbox_ = std::make_shared<runtime::admin_inbox>();
    admin_ = std::make_unique<admin_api>(token, inbox_);
    admin_routes.push_back(admin_->route());
    if (has_page)
      append(admin_routes, live_page_routes(*options.page, page_token));
  }
  if (serves_metrics_) {
    std::vector<metrics::http_route> routes{
      metrics::prometheus_route([this] { return registry_.expose(); })};
    if (shared) {
      append(admin_routes, std::move(routes));
      if (!has_page)
        admin_routes.push_back(metrics::index_route());
    } else {
      if (has_page && page == "open")
        append(routes, live_page_routes(*options.page, std::nullopt));
      else
        routes.push_back(metrics::index_route());
      metrics_server_ =
        listen(job.metrics.bind, mport, std::move(routes), std::nullopt,
               "metrics.port", "--metrics-port, or --no-metrics");
    }
  }
  if (serves_admin)
    admin_server_ = listen(job.admin.bind, aport, std::move(admin_routes), tls,
                           "admin.port", "--admin-port");

  const std::string admin_scheme = tls ? "https://" : "http://";
  if (serves_metrics_)
    std::cout << program << ": metrics at "
              << (shared ? admin_scheme : "http://") << job.metrics.bind << ":"
              << metrics_port() << "/metrics" << std::endl;
  if (serves_admin)
    std::cout << program << ": admin endpoint at " << job.admin.bind << ":"
              << admin_port() << (tls ? " (TLS)" : "") << std::endl;
  if (has_page && (serves_admin || (serves_metrics_ && page == "open"))) {
    const bool on_admin = serves_admin;
    std::cout << program << ": live page at "
              << (on_admin ? admin_scheme : "http://")
              << (on_admin ? job.admin.bind : job.metrics.bind) << ":"
              << (on_admin ? admin_port() : metrics_port()) << "/"
              << (page == "token" ? " (admin token)" : "") << std::endl;
  }
}

int run_endpoints::metrics_port() const noexcept {
  if (!serves_metrics_)
    return 0;
  return metrics_server_ ? metrics_server_->port() : admin_port();
}

int run_endpoints::admin_port() const noexcept {
  return admin_server_ ? admin_server_->port() : 0;
}

} // namespace h2::apps
