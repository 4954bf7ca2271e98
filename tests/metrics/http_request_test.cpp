// The request side of the /metrics endpoint without sockets: where a head
// ends and what its request line asks (http_request.hpp). The server's
// answers over real sockets are http_server_test's.
#include "h2/metrics/http_request.hpp"

#include <gtest/gtest.h>

#include <string>
#include <string_view>

namespace h2::metrics {
namespace {

/// Where find_request_head_end says the head of `text` ends, or npos.
std::size_t head_end(std::string_view text) {
  auto [at, found] = find_request_head_end(text.begin(), text.end());
  return found ? static_cast<std::size_t>(at - text.begin())
               : std::string_view::npos;
}

TEST(metrics_http_request, a_head_ends_after_its_blank_line) {
  EXPECT_EQ(head_end("GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), 27u);
  EXPECT_EQ(head_end("GET / HTTP/1.1\n\nbody"), 16u);
  EXPECT_EQ(head_end("GET / HTTP/1.1\r\nHost: x\r\n"), std::string_view::npos);
  EXPECT_EQ(head_end("GET / HTTP/1.1\r\n\r"), std::string_view::npos);
  EXPECT_EQ(head_end(""), std::string_view::npos);
}

TEST(metrics_http_request, an_incomplete_head_resumes_at_its_last_newline) {
  std::string_view text = "GET / HTTP/1.1\r\nHost: x\r\n\r";
  auto [at, found] = find_request_head_end(text.begin(), text.end());
  EXPECT_FALSE(found);
  EXPECT_EQ(at - text.begin(), 24); // the '\n' before the pending "\r"
}

TEST(metrics_http_request, the_request_line_gives_method_and_path) {
  auto r = parse_http_request("GET /metrics?x=1#top HTTP/1.1\r\nHost: x\r\n");
  EXPECT_EQ(r.error_status, 0);
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.path, "/metrics");
  r = parse_http_request("\r\n\r\nHEAD / HTTP/1.0\r\n");
  EXPECT_EQ(r.error_status, 0);
  EXPECT_EQ(r.method, "HEAD");
  EXPECT_EQ(r.path, "/");
}

TEST(metrics_http_request, an_absolute_target_is_reduced_to_its_path) {
  EXPECT_EQ(parse_http_request("GET http://h:9400/metrics HTTP/1.1\r\n").path,
            "/metrics");
  EXPECT_EQ(parse_http_request("GET http://h:9400 HTTP/1.1\r\n").path, "/");
}

TEST(metrics_http_request, malformed_lines_are_400_and_other_versions_505) {
  for (std::string_view bad :
       {"", "\r\n", "GET /\r\n", "GET  / HTTP/1.1\r\n", "GET / HTTP/1.1 x\r\n",
        "G(T / HTTP/1.1\r\n", "GET metrics HTTP/1.1\r\n", "GET / FTP/1.1\r\n",
        " / HTTP/1.1\r\n"}) {
    auto r = parse_http_request(bad);
    EXPECT_EQ(r.error_status, 400) << bad;
    EXPECT_TRUE(r.method.empty()) << bad;
  }
  EXPECT_EQ(parse_http_request("GET / HTTP/2.0\r\n").error_status, 505);
}

TEST(metrics_http_request, the_body_length_is_one_content_length) {
  EXPECT_EQ(
    parse_http_request("POST /a HTTP/1.1\r\nHost: h\r\n\r\n").content_length,
    0u);
  EXPECT_EQ(parse_http_request("POST /a HTTP/1.1\r\ncontent-LENGTH:  42 "
                               "\r\n\r\n")
              .content_length,
            42u);
  EXPECT_EQ(parse_http_request("POST /a HTTP/1.1\r\nContent-Length: 7\r\n"
                               "Content-Length: 7\r\n\r\n")
              .content_length,
            7u);
  for (std::string_view bad :
       {"POST /a HTTP/1.1\r\nContent-Length: 7\r\nContent-Length: 8\r\n\r\n",
        "POST /a HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        "POST /a HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n",
        "POST /a HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"}) {
    EXPECT_EQ(parse_http_request(bad).error_status, 400) << bad;
  }
}

TEST(metrics_http_request, authorization_and_host_are_read_once) {
  auto r = parse_http_request(
    "GET / HTTP/1.1\r\nhost: 127.0.0.1:9400\r\nAuthorization: Bearer x\r\n");
  EXPECT_EQ(r.error_status, 0);
  EXPECT_EQ(r.host, "127.0.0.1:9400");
  EXPECT_EQ(r.authorization, "Bearer x");
  EXPECT_EQ(
    parse_http_request("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n").error_status,
    400);
}

TEST(metrics_http_request, only_literals_and_localhost_are_local_hosts) {
  for (std::string_view ok :
       {"127.0.0.1", "127.0.0.1:9400", "10.1.2.3:80", "localhost",
        "LocalHost:9400", "[::1]", "[::1]:9400"})
    EXPECT_TRUE(host_is_local_literal(ok)) << ok;
  for (std::string_view bad :
       {"", "attacker.example", "attacker.example:9400", "127.0.0.1.nip.io",
        "localhost.attacker.example", "1.2.3", "[::1", "[::1]x", "b"})
    EXPECT_FALSE(host_is_local_literal(bad)) << bad;
}

} // namespace
} // namespace h2::metrics
