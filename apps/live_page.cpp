#include "h2/apps/live_page.hpp"

#include "h2/core/error.hpp"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>

namespace h2 {
// Generated from apps/page/ (apps/CMakeLists.txt).
extern const char* const live_page_html;
extern const char* const live_page_js;
extern const char* const live_page_css;
} // namespace h2

namespace h2::apps {

namespace {

/// What the browser may load for the page: only what this server serves
/// (and the images the page makes from its answers).
constexpr std::string_view page_policy =
  "default-src 'none'; script-src 'self'; style-src 'self'; "
  "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; "
  "form-action 'none'; frame-ancestors 'none'";

metrics::http_answer page_answer(std::string content_type, std::string body) {
  metrics::http_answer a{200, std::move(content_type), std::move(body)};
  a.headers = {{"Content-Security-Policy", std::string(page_policy)},
               {"X-Content-Type-Options", "nosniff"},
               {"Referrer-Policy", "no-referrer"},
               {"Cache-Control", "no-store"}};
  return a;
}

using digest = std::array<unsigned char, SHA256_DIGEST_LENGTH>;

digest sha256(std::string_view text) {
  digest d{};
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         d.data());
  return d;
}

/// Whether `authorization` is "Bearer <token>" (the scheme in any case).
/// Compares the SHA-256 of both in constant time.
bool carries_token(std::string_view authorization, const digest& token) {
  constexpr std::string_view scheme = "bearer ";
  if (authorization.size() <= scheme.size() ||
      !std::equal(scheme.begin(), scheme.end(), authorization.begin(),
                  [](char a, char b) {
                    return a == std::tolower(static_cast<unsigned char>(b));
                  }))
    return false;
  const auto given = sha256(authorization.substr(scheme.size()));
  return CRYPTO_memcmp(given.data(), token.data(), given.size()) == 0;
}

} // namespace

std::vector<metrics::http_route>
live_page_routes(const runtime::run_view& view,
                 const std::optional<std::string>& token) {
  std::string html = live_page_html;
  if (token) { // the page asks for the token before it asks for data
    constexpr std::string_view tag = "<html lang=\"en\">";
    const auto at = html.find(tag);
    H2_ENFORCE(at != std::string::npos, "apps/page/index.html lost ", tag);
    html.replace(at, tag.size(), "<html lang=\"en\" data-page=\"token\">");
  }
  std::optional<digest> expected;
  if (token)
    expected = sha256(*token);
  auto allowed = [expected](const metrics::http_call& call) {
    return !expected || carries_token(call.authorization, *expected);
  };
  auto refused = [] {
    auto a = page_answer("application/json",
                         "{\"error\":\"this page needs the admin token\"}");
    a.status = 401;
    a.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"h2\"");
    return a;
  };
  return {
    {"/", "GET",
     [html](const metrics::http_call&) {
       return page_answer("text/html; charset=utf-8", html);
     }},
    {"/page.js", "GET",
     [](const metrics::http_call&) {
       return page_answer("text/javascript; charset=utf-8", live_page_js);
     }},
    {"/page.css", "GET",
     [](const metrics::http_call&) {
       return page_answer("text/css; charset=utf-8", live_page_css);
     }},
    {"/api/state", "GET",
     [&view, allowed, refused](const metrics::http_call& call) {
       return allowed(call) ? page_answer("application/json", view.state_json())
                            : refused();
     }},
    {"/api/timeline.svg", "GET",
     [&view, allowed, refused](const metrics::http_call& call) {
       if (!allowed(call))
         return refused();
       auto svg = view.timeline_svg();
       if (!svg) {
         auto a = page_answer("application/json",
                              "{\"error\":\"no step recorded yet\"}");
         a.status = 404;
         return a;
       }
       return page_answer("image/svg+xml", std::move(*svg));
     }},
  };
}

} // namespace h2::apps
