#include "h2/transport/mailbox.hpp"

#include <algorithm>

namespace h2::transport {

bool mailbox::deliver(message m) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (cancelled_)
    return true;
  auto bytes = m.payload_bytes();
  auto w = waiters_.find(m.tag);
  if (w != waiters_.end()) {
    while (!w->second.empty()) {
      waiter next = std::move(w->second.front());
      w->second.pop_front();
      if (next->complete(m)) {
        ++messages_;
        bytes_ += bytes;
        if (w->second.empty())
          waiters_.erase(w);
        return true;
      }
    }
    waiters_.erase(w);
  }
  if (queued_count_ >= max_unawaited_) {
    fail_locked(transport_error(transport_errc::corrupt_frame,
                                "corrupt frame: the peer sent more than " +
                                  std::to_string(max_unawaited_) +
                                  " messages that no receive waits for (tag " +
                                  std::to_string(m.tag) + ")"));
    return false;
  }
  queued_[m.tag].push_back(std::move(m));
  ++queued_count_;
  return true;
}

void mailbox::set_max_unawaited(std::size_t n) {
  std::lock_guard<std::mutex> guard(mutex_);
  max_unawaited_ = n;
}

pending_message mailbox::receive(std::uint64_t tag) {
  auto s = std::make_shared<pending_message::state>();
  s->tag = tag;
  std::lock_guard<std::mutex> guard(mutex_);
  auto q = queued_.find(tag);
  if (!cancelled_ && q != queued_.end() && !q->second.empty()) {
    message m = std::move(q->second.front());
    q->second.pop_front();
    --queued_count_;
    if (q->second.empty())
      queued_.erase(q);
    ++messages_;
    bytes_ += m.payload_bytes();
    s->complete(m);
  } else if (failure_) {
    s->fail(*failure_);
  } else {
    // Receives that timed out are still listed; drop them so a loop polling
    // a quiet tag does not grow the list.
    auto& ws = waiters_[tag];
    std::erase_if(ws, [](const waiter& w) { return w->ended(); });
    s->progress = progress_;
    ws.push_back(s);
  }
  return pending_message(std::move(s));
}

void mailbox::fail(const transport_error& e) {
  std::lock_guard<std::mutex> guard(mutex_);
  fail_locked(e);
}

void mailbox::fail_locked(const transport_error& e) {
  if (failure_)
    return;
  failure_ = e;
  for (auto& [tag, ws] : waiters_)
    for (auto& w : ws)
      w->fail(e);
  waiters_.clear();
}

void mailbox::cancel(const std::string& why) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (cancelled_)
    return;
  cancelled_ = true;
  failure_ = transport_error(transport_errc::cancelled, why);
  for (auto& [tag, ws] : waiters_)
    for (auto& w : ws)
      w->fail(*failure_);
  waiters_.clear();
  queued_.clear();
  queued_count_ = 0;
}

void mailbox::set_progress(std::shared_ptr<receive_progress> p) {
  std::lock_guard<std::mutex> guard(mutex_);
  progress_ = std::move(p);
}

std::optional<transport_error> mailbox::failure() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return failure_;
}

std::uint64_t mailbox::messages_delivered() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return messages_;
}

std::uint64_t mailbox::bytes_delivered() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return bytes_;
}

} // namespace h2::transport
