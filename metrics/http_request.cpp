#include "h2/metrics/http_request.hpp"

#include <algorithm>
#include <cctype>
#include <optional>

namespace h2::metrics {

namespace {

bool is_token_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

/// The body's length and the Authorization and Host headers from the
/// header lines after the request line; false for a chunked body, a length
/// that is not one decimal number, or two Authorization or Host headers.
bool read_headers(std::string_view headers, http_request& r) {
  std::optional<std::size_t> found;
  bool authorized = false, hosted = false;
  while (!headers.empty()) {
    const auto nl = headers.find('\n');
    const auto line = headers.substr(0, nl);
    headers = nl == headers.npos ? std::string_view() : headers.substr(nl + 1);
    const auto colon = line.find(':');
    if (colon == line.npos)
      continue;
    const auto name = trimmed(line.substr(0, colon));
    const auto value = trimmed(line.substr(colon + 1));
    if (equal_ignoring_case(name, "transfer-encoding"))
      return false; // only Content-Length bodies are read
    if (equal_ignoring_case(name, "authorization")) {
      if (authorized)
        return false;
      authorized = true;
      r.authorization = value;
      continue;
    }
    if (equal_ignoring_case(name, "host")) {
      if (hosted)
        return false;
      hosted = true;
      r.host = value;
      continue;
    }
    if (!equal_ignoring_case(name, "content-length"))
      continue;
    if (value.empty() || value.size() > 18 ||
        !std::all_of(value.begin(), value.end(),
                     [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    std::size_t n = 0;
    for (char c : value)
      n = n * 10 + static_cast<std::size_t>(c - '0');
    if (found && *found != n)
      return false;
    found = n;
  }
  r.content_length = found.value_or(0);
  return true;
}

} // namespace

http_request parse_http_request(std::string_view head) {
  http_request r;
  while (!head.empty() && (head.front() == '\r' || head.front() == '\n'))
    head.remove_prefix(1);
  const auto line_end = head.find('\n');
  auto line = head.substr(0, line_end);
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
  if (!read_headers(line_end == head.npos ? std::string_view()
                                          : head.substr(line_end + 1),
                    r)) {
    r.error_status = 400;
    return r;
  }
  r.method = method;
  r.path = target.substr(0, target.find_first_of("?#"));
  return r;
}

bool host_is_local_literal(std::string_view host) {
  if (host.empty())
    return false;
  if (host.front() == '[') { // an IPv6 literal, then an optional port
    const auto close = host.find(']');
    return close != host.npos &&
           (close + 1 == host.size() || host[close + 1] == ':');
  }
  if (const auto colon = host.rfind(':'); colon != host.npos)
    host = host.substr(0, colon);
  if (equal_ignoring_case(host, "localhost"))
    return true;
  int dots = 0;
  for (char c : host) {
    if (c == '.')
      ++dots;
    else if (c < '0' || c > '9')
      return false;
  }
  return dots == 3;
}

} // namespace h2::metrics
