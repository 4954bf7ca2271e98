#include "h2/transport/channel.hpp"

#include "h2/transport/spin.hpp"

#include <algorithm>
#include <string>

namespace h2::transport {

std::uint64_t message::payload_bytes() const noexcept {
  if (tensor.defined())
    return static_cast<std::uint64_t>(tensor.numel()) * tensor.element_size();
  return bytes.size();
}

bool pending_message::state::complete(message& m) {
  {
    std::lock_guard<std::mutex> guard(mutex);
    if (value || failure)
      return false;
    value = std::move(m);
    done.store(true, std::memory_order_release);
  }
  ready.notify_all();
  return true;
}

bool pending_message::state::ended() {
  std::lock_guard<std::mutex> guard(mutex);
  return value.has_value() || failure.has_value();
}

void pending_message::state::fail(const transport_error& e) {
  {
    std::lock_guard<std::mutex> guard(mutex);
    if (value || failure)
      return;
    failure = e;
    done.store(true, std::memory_order_release);
  }
  ready.notify_all();
}

message pending_message::get(std::chrono::duration<double> timeout) {
  H2_ENFORCE(state_ != nullptr, "pending_message used twice");
  auto s = std::move(state_);
  // A timeout of centuries would overflow the steady clock; longer waits
  // are capped at 100 years ("wait").
  constexpr std::chrono::duration<double> longest =
    std::chrono::hours(24 * 365 * 100);
  const auto until =
    std::chrono::steady_clock::now() +
    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::min(timeout, longest));
  if (s->progress) {
    // The channel lets this thread read arrived messages itself.
    s->progress->wait(s->done, until);
  } else {
    // Spin briefly before sleeping, where cores allow: a message about to
    // arrive is then taken without a thread wake-up.
    spin_until([&] { return s->done.load(std::memory_order_acquire); },
               spin_budget(std::chrono::microseconds(20)));
  }
  std::unique_lock<std::mutex> lock(s->mutex);
  auto arrived = [&] {
    return s->value.has_value() || s->failure.has_value();
  };
  bool done = arrived();
  if (!done && !s->progress)
    done = s->ready.wait_until(lock, until, arrived);
  if (!done) {
    // Mark it ended so a message arriving later is queued for the next
    // receive of the tag instead of being delivered into the void.
    s->done.store(true, std::memory_order_release);
    s->failure =
      transport_error(transport_errc::timeout,
                      "no message with tag " + std::to_string(s->tag) +
                        " within " + std::to_string(timeout.count()) + " s");
    throw *s->failure;
  }
  if (s->failure)
    throw *s->failure;
  return std::move(*s->value);
}

bool pending_message::ready() const {
  if (!state_)
    return false;
  if (state_->progress && !state_->done.load(std::memory_order_acquire))
    state_->progress->poll();
  std::lock_guard<std::mutex> guard(state_->mutex);
  return state_->value.has_value() || state_->failure.has_value();
}

} // namespace h2::transport
