#include "h2/runtime/watchdog.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace h2::runtime {

namespace {

double seconds_between(watchdog_clock::time_point a,
                       watchdog_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, x);
  return buf;
}

} // namespace

void chip_progress::begin(const char* op, int micro_batch,
                          double predicted_seconds,
                          watchdog_clock::time_point now) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (predicted_seconds < 0) {
    auto last = last_seconds_.find(op);
    if (last != last_seconds_.end())
      predicted_seconds = last->second;
  }
  now_ = {true, op, micro_batch, predicted_seconds, now};
}

void chip_progress::end(watchdog_clock::time_point now) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (!now_.busy)
    return;
  last_seconds_[now_.op] = seconds_between(now_.started, now);
  now_.busy = false;
}

chip_progress::snapshot chip_progress::read() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return now_;
}

std::string chip_progress::stalled() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return stalled_;
}

void chip_progress::set_stalled(const std::string& why) {
  std::lock_guard<std::mutex> guard(mutex_);
  stalled_ = why;
}

std::string stall::message() const {
  std::string out = "chip " + chip.to_string() + " stalled: its " + op;
  if (micro_batch >= 0)
    out += " of micro-batch " + std::to_string(micro_batch);
  out += " has run " + fixed(ran_seconds, 1) + " s, past ";
  if (floor_bound)
    out += "watchdog.floor_seconds (" + fixed(limit_seconds, 1) + " s)";
  else
    out += fixed(limit_seconds, 1) + " s (watchdog.factor x its predicted " +
           fixed(predicted_seconds, 3) + " s)";
  return out;
}

progress_watchdog::progress_watchdog(watchdog_config config) : config_(config) {
}

std::shared_ptr<chip_progress> progress_watchdog::watch(const chip_id& chip) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto& p = chips_[chip];
  if (!p)
    p = std::make_shared<chip_progress>();
  return p;
}

void progress_watchdog::suspend() {
  std::lock_guard<std::mutex> guard(mutex_);
  ++suspended_;
}

void progress_watchdog::resume(watchdog_clock::time_point now) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (suspended_ > 0 && --suspended_ == 0)
    resumed_ = now;
}

std::vector<stall>
progress_watchdog::check(watchdog_clock::time_point now) const {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<stall> out;
  if (suspended_ > 0 || config_.factor <= 0)
    return out;
  for (const auto& [chip, progress] : chips_) {
    const auto s = progress->read();
    if (!s.busy)
      continue;
    const double ran = seconds_between(std::max(s.started, resumed_), now);
    const double by_factor =
      s.predicted_seconds >= 0 ? config_.factor * s.predicted_seconds : -1;
    const bool floor_bound = by_factor <= config_.floor_seconds;
    const double limit = floor_bound ? config_.floor_seconds : by_factor;
    if (ran > limit)
      out.push_back({chip, s.op, s.micro_batch, ran, s.predicted_seconds, limit,
                     floor_bound});
  }
  return out;
}

void exit_stuck(const stall& s) {
  std::fprintf(stderr, "h2: %s; it does not end: exiting\n",
               s.message().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

watchdog_thread::watchdog_thread(std::shared_ptr<progress_watchdog> watchdog,
                                 std::function<void(const stall&)> on_stall,
                                 std::function<void(const stall&)> on_stuck,
                                 std::chrono::milliseconds interval,
                                 std::chrono::seconds grace)
    : watchdog_(std::move(watchdog)),
      on_stall_(std::move(on_stall)),
      on_stuck_(std::move(on_stuck)),
      interval_(interval),
      grace_(grace) {
  thread_ = std::thread([this] { run(); });
}

watchdog_thread::~watchdog_thread() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::optional<stall> watchdog_thread::stalled() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return found_;
}

void watchdog_thread::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!found_) {
    if (wake_.wait_for(lock, interval_, [this] { return stop_; }))
      return;
    auto stalls = watchdog_->check(watchdog_clock::now());
    if (!stalls.empty())
      found_ = stalls.front();
  }
  const stall found = *found_;
  watchdog_->watch(found.chip)->set_stalled(found.message());
  lock.unlock();
  if (on_stall_)
    on_stall_(found);
  lock.lock();
  if (wake_.wait_for(lock, grace_, [this] { return stop_; }))
    return;
  lock.unlock();
  if (on_stuck_)
    on_stuck_(found);
}

} // namespace h2::runtime
