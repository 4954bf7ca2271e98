// The live page of a run (docs/admin.md, "Live page") as routes of H2's
// HTTP server: `GET /` (the page), `/page.js`, `/page.css` (served by the
// job itself, nothing from elsewhere: its Content-Security-Policy says so
// to the browser), `/api/state` (runtime::run_view's JSON) and
// `/api/timeline.svg` (the last step as measured).
#pragma once

#include "h2/metrics/http_server.hpp"
#include "h2/runtime/run_view.hpp"

#include <optional>
#include <string>
#include <vector>

namespace h2::apps {

/// The page's routes over `view`, which must outlive every server serving
/// them. With a `token` (`[admin] page = "token"`: the admin token's
/// text), `/api/*` answer 401 unless the request carries `Authorization:
/// Bearer <token>`; the page itself holds no data and asks the user for
/// the token. Only the token's SHA-256 is kept.
std::vector<metrics::http_route>
live_page_routes(const runtime::run_view& view,
                 const std::optional<std::string>& token);

} // namespace h2::apps
