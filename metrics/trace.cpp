#include "h2/metrics/trace.hpp"

#include "h2/core/error.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

namespace h2::metrics {

namespace {

constexpr double microseconds_per_second = 1e6;

} // namespace

void trace_writer::add(const nlohmann::json& event) {
  auto text =
    event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(text));
}

void trace_writer::complete(std::string name, std::string category, int pid,
                            int tid, double start_seconds,
                            double duration_seconds, nlohmann::json args) {
  H2_ENFORCE(std::isfinite(start_seconds), "trace event ", name, " starts at ",
             start_seconds);
  H2_ENFORCE(std::isfinite(duration_seconds) && duration_seconds >= 0,
             "trace event ", name, " lasts ", duration_seconds, " s");
  H2_ENFORCE(args.is_null() || args.is_object(), "trace event ", name,
             ": args must be a JSON object");
  nlohmann::json event = {{"name", std::move(name)},
                          {"cat", std::move(category)},
                          {"ph", "X"},
                          {"ts", start_seconds * microseconds_per_second},
                          {"dur", duration_seconds * microseconds_per_second},
                          {"pid", pid},
                          {"tid", tid}};
  if (!args.is_null())
    event["args"] = std::move(args);
  add(event);
}

void trace_writer::name_process(int pid, std::string name) {
  add({{"name", "process_name"},
       {"ph", "M"},
       {"pid", pid},
       {"tid", 0},
       {"args", {{"name", std::move(name)}}}});
}

void trace_writer::name_thread(int pid, int tid, std::string name) {
  add({{"name", "thread_name"},
       {"ph", "M"},
       {"pid", pid},
       {"tid", tid},
       {"args", {{"name", std::move(name)}}}});
}

void trace_writer::counter(std::string name, int pid, double time_seconds,
                           nlohmann::json values) {
  H2_ENFORCE(std::isfinite(time_seconds), "trace counter ", name, " at ",
             time_seconds);
  H2_ENFORCE(values.is_object(), "trace counter ", name,
             ": values must be a JSON object");
  for (const auto& [key, value] : values.items())
    H2_ENFORCE(value.is_number(), "trace counter ", name, ": series ", key,
               " is not a number");
  add({{"name", std::move(name)},
       {"ph", "C"},
       {"ts", time_seconds * microseconds_per_second},
       {"pid", pid},
       {"args", std::move(values)}});
}

std::size_t trace_writer::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::string trace_writer::to_string() const {
  std::string out = "{\"traceEvents\":[";
  {
    std::lock_guard lock(mutex_);
    std::size_t bytes = 0;
    for (const auto& e : events_)
      bytes += e.size() + 2;
    out.reserve(out.size() + bytes + 64);
    for (std::size_t i = 0; i < events_.size(); ++i) {
      out += i == 0 ? "\n" : ",\n";
      out += events_[i];
    }
  }
  out += "\n],\"displayTimeUnit\":\"ms\"}\n";
  return out;
}

void trace_writer::write(const std::string& path) const {
  auto text = to_string();
  auto fail = [&](int err) {
    throw error("cannot write trace to " + path + ": " + std::strerror(err));
  };
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr)
    fail(errno);
  if (std::fwrite(text.data(), 1, text.size(), file) != text.size()) {
    int err = errno;
    std::fclose(file);
    fail(err);
  }
  if (std::fclose(file) != 0)
    fail(errno);
}

} // namespace h2::metrics
