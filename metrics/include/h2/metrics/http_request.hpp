// The request side of the /metrics endpoint (http_server.hpp): where a
// request head ends and what its request line asks for. Pure functions over
// the bytes a client sent, which may be hostile (docs/architecture.md,
// "Trust"); fuzzed (docs/fuzzing.md).
#pragma once

#include <iterator>
#include <string>
#include <string_view>
#include <utility>

namespace h2::metrics {

/// What a request line asks for, and the length of the body that follows
/// its head.
struct http_request {
  std::string method;   ///< a token ("GET", "HEAD", ...); empty on error
  std::string path;     ///< starts with '/'; without query or fragment
  int error_status = 0; ///< 400 or 505 when the request cannot be served
  /// Content-Length (0 without one); a body sent chunked, or a length that
  /// is not one decimal number (or several that differ), is 400.
  std::size_t content_length = 0;
  /// The Authorization header's value ("" without one; several are 400).
  std::string authorization;
  /// The Host header's value ("" without one; several are 400).
  std::string host;
};

/// Where the request head in [begin, end) ends: the position after its
/// blank line ("\r\n\r\n", or "\n\n" from lenient clients) and true, or
/// where to resume the search once more bytes came and false. The match
/// condition of the server's async_read_until; any forward iterator over
/// chars.
template <class Iterator>
std::pair<Iterator, bool> find_request_head_end(Iterator begin, Iterator end) {
  for (auto it = begin; it != end; ++it) {
    if (*it != '\n')
      continue;
    auto next = std::next(it);
    if (next == end)
      return {it, false};
    if (*next == '\n')
      return {std::next(next), true};
    if (*next == '\r') {
      auto after = std::next(next);
      if (after == end)
        return {it, false};
      if (*after == '\n')
        return {std::next(after), true};
    }
  }
  return {end, false};
}

/// Reads the request line of `head`: "METHOD TARGET HTTP/1.x", leading
/// blank lines skipped; an absolute target ("http://host:port/metrics") is
/// reduced to its path. A malformed line is error_status 400, another HTTP
/// version 505. Of the headers it reads only Content-Length and
/// Transfer-Encoding (the body's length), Authorization and Host. Never
/// throws but std::bad_alloc.
http_request parse_http_request(std::string_view head);

/// Whether a Host header's value (port optional) names this machine in a
/// way DNS cannot rebind: an IPv4 or a bracketed IPv6 literal, or
/// "localhost". A server bound to loopback answers only such requests (or
/// ones without a Host), so a web page the operator visits cannot reach it
/// through a name the attacker's DNS points at 127.0.0.1.
bool host_is_local_literal(std::string_view host);

} // namespace h2::metrics
