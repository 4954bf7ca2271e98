// The receive side every backend shares: arrived messages by tag, receives
// waiting for them, and the fate of the channel (open, failed, cancelled).
// Backends deliver into it from wherever bytes arrive (another thread of
// this process, a reader thread); channel::recv_async takes from it.
#pragma once

#include "h2/transport/channel.hpp"

#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace h2::transport {

class mailbox {
public:
  /// Hands `m` to the oldest waiting receive of its tag, or queues it.
  /// Ignored once this end is cancelled (nobody will read it). False when
  /// queueing it would pass the bound of set_max_unawaited(): then the
  /// mailbox fails with corrupt_frame instead (and drops `m`).
  bool deliver(message m);

  /// Bounds the messages queued for tags no receive waits for.
  void set_max_unawaited(std::size_t n);

  /// A receive of `tag`: completes at once from the queue, or fails with the
  /// channel's failure when nothing is queued and the channel failed.
  pending_message receive(std::uint64_t tag);

  /// The peer is gone or the link broke: every waiting receive, and every
  /// later one with nothing queued, fails with `e`. The first failure wins.
  void fail(const transport_error& e);

  /// This end was closed: waiting and later receives fail with `cancelled`.
  void cancel(const std::string& why);

  /// The failure, if the channel failed or was cancelled.
  std::optional<transport_error> failure() const;

  /// Receives made from now on poll `p` while they wait (set once, before
  /// the first receive).
  void set_progress(std::shared_ptr<receive_progress> p);

  std::uint64_t messages_delivered() const;
  std::uint64_t bytes_delivered() const;

private:
  using waiter = std::shared_ptr<pending_message::state>;

  /// fail() under mutex_.
  void fail_locked(const transport_error& e);

  mutable std::mutex mutex_;
  std::map<std::uint64_t, std::deque<message>> queued_;
  std::map<std::uint64_t, std::deque<waiter>> waiters_;
  std::optional<transport_error> failure_;
  std::shared_ptr<receive_progress> progress_;
  bool cancelled_ = false;
  std::size_t queued_count_ = 0; ///< messages in queued_
  std::size_t max_unawaited_ = channel_limits{}.max_unawaited;
  std::uint64_t messages_ = 0;
  std::uint64_t bytes_ = 0;
};

} // namespace h2::transport
