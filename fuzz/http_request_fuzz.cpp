// The request side of the /metrics endpoint (metrics/http_request.hpp): the
// bytes a client sends, cut where the server's async_read_until would (the
// end of the head, within max_request_head_bytes), then the request line.
// Input: what the client sent.
#include "fuzz.hpp"

#include "h2/metrics/http_request.hpp"
#include "h2/metrics/http_server.hpp"

#include <algorithm>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  using h2::fuzz::require;
  auto sent = h2::fuzz::as_text(data, size);
  // The server's buffer holds at most this much; no end within it is 431.
  sent = sent.substr(
    0, std::min(sent.size(), h2::metrics::http_server::max_request_head_bytes));
  auto [end, found] =
    h2::metrics::find_request_head_end(sent.begin(), sent.end());
  require(end >= sent.begin() && end <= sent.end(),
          "the end lies in the input");
  if (!found)
    return 0;
  const std::string_view head(sent.data(),
                              static_cast<std::size_t>(end - sent.begin()));
  require(head.ends_with("\n\n") || head.ends_with("\n\r\n"),
          "a head ends in a blank line");
  const auto r = h2::metrics::parse_http_request(head);
  if (r.error_status != 0) {
    require(r.error_status == 400 || r.error_status == 505,
            "a refused request is 400 or 505");
    require(r.method.empty() && r.path.empty(), "a refused request is empty");
    return 0;
  }
  require(!r.method.empty() && r.method.find(' ') == std::string::npos,
          "a method is one token");
  require(!r.path.empty() && r.path.front() == '/', "a path starts with '/'");
  require(r.path.find_first_of("?# \n") == std::string::npos,
          "a path holds no query, fragment, space or newline");
  return 0;
}
