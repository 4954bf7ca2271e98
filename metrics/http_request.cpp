#include "h2/metrics/http_request.hpp"

#include <algorithm>

namespace h2::metrics {

namespace {

bool is_token_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

} // namespace

http_request parse_http_request(std::string_view head) {
  http_request r;
  while (!head.empty() && (head.front() == '\r' || head.front() == '\n'))
    head.remove_prefix(1);
  auto line = head.substr(0, head.find('\n'));
  if (!line.empty() && line.back() == '\r')
    line.remove_suffix(1);
  auto sp1 = line.find(' ');
  auto sp2 = sp1 == line.npos ? line.npos : line.find(' ', sp1 + 1);
  if (sp2 == line.npos || line.find(' ', sp2 + 1) != line.npos) {
    r.error_status = 400;
    return r;
  }
  auto method = line.substr(0, sp1);
  auto target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  auto version = line.substr(sp2 + 1);
  if (method.empty() ||
      !std::all_of(method.begin(), method.end(), is_token_char) ||
      version.substr(0, 5) != "HTTP/") {
    r.error_status = 400;
    return r;
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    r.error_status = 505;
    return r;
  }
  // Absolute form ("http://host:port/metrics"), as sent to proxies.
  if (auto scheme = target.find("://");
      scheme != target.npos && target.substr(0, 1) != "/") {
    auto slash = target.find('/', scheme + 3);
    target =
      slash == target.npos ? std::string_view("/") : target.substr(slash);
  }
  if (target.empty() || target.front() != '/') {
    r.error_status = 400;
    return r;
  }
  r.method = method;
  r.path = target.substr(0, target.find_first_of("?#"));
  return r;
}

} // namespace h2::metrics
