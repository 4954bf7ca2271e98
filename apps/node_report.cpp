#include "h2/apps/node_report.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>

#include <unistd.h>

namespace h2::apps {

namespace {

/// Bytes an event line may take.
constexpr std::size_t max_event_bytes = 4096;

} // namespace

node_report::~node_report() {
  if (fd_ >= 0)
    ::close(fd_);
}

void node_report::listening(std::string_view service, std::string_view host,
                            int port) {
  write_line(
    nlohmann::json{{"event", "listening"},
                   {"service", service},
                   {"address", std::string(host) + ":" + std::to_string(port)}}
      .dump());
}

void node_report::state(std::string_view state) {
  write_line(nlohmann::json{{"event", "state"}, {"state", state}}.dump());
}

void node_report::write_line(const std::string& line) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (fd_ < 0)
    return;
  const std::string out = line + "\n";
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::write(fd_, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; // the launcher is gone: its watch ends this node
    done += static_cast<std::size_t>(n);
  }
}

std::optional<node_event> parse_node_event(std::string_view line) {
  if (line.size() > max_event_bytes)
    return std::nullopt;
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return std::nullopt;
  auto text = [&](const char* key) -> std::optional<std::string> {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string())
      return std::nullopt;
    return it->get<std::string>();
  };
  node_event e;
  const auto event = text("event");
  if (event == "listening") {
    const auto service = text("service");
    const auto address = text("address");
    if (!service || !address || address->rfind(':') == std::string::npos)
      return std::nullopt;
    e.service = *service;
    e.address = *address;
  } else if (event == "state") {
    const auto state = text("state");
    if (!state)
      return std::nullopt;
    e.state = *state;
  } else {
    return std::nullopt;
  }
  e.event = *event;
  return e;
}

} // namespace h2::apps
