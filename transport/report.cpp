#include "h2/transport/report.hpp"

namespace h2::transport {

throttled_report::throttled_report(log_sink sink,
                                   std::chrono::milliseconds interval)
    : sink_(std::move(sink)), interval_(interval) {
}

void throttled_report::operator()(const std::string& line) {
  std::string out;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    ++count_;
    const auto now = std::chrono::steady_clock::now();
    if (reported_ && now - last_ < interval_) {
      ++folded_;
      return;
    }
    out = line;
    if (folded_ > 0)
      out += " (" + std::to_string(folded_) + " more since the last report)";
    reported_ = true;
    last_ = now;
    folded_ = 0;
  }
  if (sink_)
    sink_(out);
}

std::uint64_t throttled_report::count() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return count_;
}

} // namespace h2::transport
