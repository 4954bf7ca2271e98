#include "h2/apps/admin_server.hpp"

#include "h2/core/error.hpp"
#include "h2/runtime/admin.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace h2::apps {

namespace {

using clock = std::chrono::steady_clock;

/// Milliseconds left until `until` (0 once it passed).
int millis_left(clock::time_point until) {
  auto left =
    std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

/// Reads up to the first newline, at most `limit` bytes, by `until`.
/// Returns false on a timeout, a closed connection or a line too long.
bool read_line(int fd, std::string& line, std::size_t limit,
               clock::time_point until, std::string& why) {
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, millis_left(until));
    if (ready == 0) {
      why = "no request within " +
            std::to_string(admin_server::request_timeout.count()) + " s";
      return false;
    }
    if (ready < 0) {
      if (errno == EINTR)
        continue;
      why = std::strerror(errno);
      return false;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      why = "the client closed the connection before a whole request";
      return false;
    }
    const char* end = static_cast<const char*>(
      std::memchr(buf, '\n', static_cast<std::size_t>(n)));
    line.append(buf, end != nullptr ? static_cast<std::size_t>(end - buf)
                                    : static_cast<std::size_t>(n));
    if (line.size() > limit) {
      why = "a request longer than " + std::to_string(limit) + " bytes";
      return false;
    }
    if (end != nullptr)
      return true;
  }
}

void write_all(int fd, const std::string& data, clock::time_point until) {
  std::size_t done = 0;
  while (done < data.size()) {
    pollfd p{fd, POLLOUT, 0};
    const int ready = ::poll(&p, 1, millis_left(until));
    if (ready <= 0 && !(ready < 0 && errno == EINTR))
      return;
    const ssize_t n =
      ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n <= 0)
      return;
    done += static_cast<std::size_t>(n);
  }
}

std::string peer_name(const sockaddr_storage& a) {
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&a), sizeof(a), host,
                sizeof(host), port, sizeof(port),
                NI_NUMERICHOST | NI_NUMERICSERV);
  return std::string(host) + ":" + port;
}

} // namespace

admin_server::admin_server(const admin_config& config,
                           std::shared_ptr<const transport::job_secret> token,
                           std::shared_ptr<runtime::admin_inbox> inbox,
                           std::FILE* log)
    : token_(std::move(token)),
      inbox_(std::move(inbox)),
      log_(log),
      verifier_(token_),
      session_(runtime::make_admin_session()) {
  const std::string where = config.bind + ":" + std::to_string(config.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(
    config.bind.c_str(), std::to_string(config.port).c_str(), &hints, &found);
  if (rc != 0)
    throw error("cannot listen on " + where +
                " (admin endpoint): " + ::gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    int fd =
      ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0)
    throw error("cannot listen on " + where + " (admin endpoint): " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.ss_family == AF_INET6
                  ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  thread_ = std::thread([this] { serve(); });
}

admin_server::~admin_server() {
  stopping_ = true;
  if (thread_.joinable())
    thread_.join();
  ::close(listen_fd_);
}

void admin_server::serve() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0)
      continue;
    sockaddr_storage from{};
    socklen_t len = sizeof(from);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from),
                             &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        std::fprintf(log_, "h2: admin: cannot accept: %s\n",
                     std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    try {
      handle(fd, peer_name(from));
    } catch (const std::exception& e) {
      std::fprintf(log_, "h2: admin: %s\n", e.what());
    }
    ::close(fd);
  }
}

void admin_server::handle(int fd, const std::string& peer) {
  const auto until = clock::now() + request_timeout;
  std::string line, why;
  if (!read_line(fd, line, runtime::max_admin_request_bytes, until, why)) {
    std::fprintf(log_, "h2: admin: refused %s: %s\n", peer.c_str(),
                 why.c_str());
    write_all(fd, runtime::admin_refusal("malformed request: " + why) + "\n",
              until);
    return;
  }
  auto refuse = [&](const std::string& message) {
    std::fprintf(log_, "h2: admin: refused %s: %s\n", peer.c_str(),
                 message.c_str());
    std::fflush(log_);
    write_all(fd, runtime::admin_refusal(message) + "\n", until);
  };
  runtime::admin_request r;
  try {
    r = runtime::decode_admin_request(line);
  } catch (const runtime::admin_error& e) {
    refuse(e.what());
    return;
  }
  if (r.asks_session()) {
    write_all(fd,
              runtime::admin_ok(nlohmann::json{{"session", session_}}.dump()) +
                "\n",
              until);
    return;
  }
  if (r.session != session_) {
    refuse("unauthorized: sealed for another run of the job (a replay, or "
           "a stale session: ask for the session again)");
    return;
  }
  if (r.seal.sender != 0 ||
      !verifier_.accept(runtime::admin_seal_type(r.command), r.seal,
                        runtime::admin_payload(session_, r.args))) {
    refuse("unauthorized: wrong admin token, or a replayed request");
    return;
  }
  runtime::admin_command command;
  try {
    command = runtime::parse_admin_command(r.command, r.args);
  } catch (const runtime::admin_error& e) {
    refuse(e.what());
    return;
  }
  const auto reply = inbox_->ask(std::move(command));
  std::string shown = r.command;
  if (r.command != "rebalance" || r.args.size() < 2) // not a whole plan
    for (const auto& a : r.args)
      shown += " " + a;
  else
    shown += " --plan <" + std::to_string(r.args[1].size()) + " bytes>";
  std::fprintf(log_, "h2: admin: %s from %s: %s\n", shown.c_str(), peer.c_str(),
               reply.ok ? "done" : reply.body.c_str());
  std::fflush(log_);
  write_all(fd,
            (reply.ok ? runtime::admin_ok(reply.body)
                      : runtime::admin_refusal(reply.body)) +
              "\n",
            until);
}

} // namespace h2::apps
