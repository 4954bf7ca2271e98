#include "h2/transport/inproc/channel.hpp"

#include <deque>
#include <map>
#include <string>

namespace h2::transport::inproc {

namespace {

using waiter = std::shared_ptr<pending_message::state>;

/// One direction of the pair.
struct mailbox {
  std::map<std::uint64_t, std::deque<message>> queued;
  std::map<std::uint64_t, std::deque<waiter>> waiters;
  bool sender_closed = false;
  bool receiver_closed = false;
  std::uint64_t messages_sent = 0, bytes_sent = 0;
  std::uint64_t messages_delivered = 0, bytes_delivered = 0;
};

/// What both ends share. One mutex for both directions keeps close() free of
/// lock-order problems; contention is two threads at most.
struct link {
  std::mutex mutex;
  mailbox directions[2];
};

class endpoint final : public channel {
public:
  endpoint(std::shared_ptr<link> l, int side)
      : link_(std::move(l)), side_(side) {}

  ~endpoint() override { close(); }

  void send(message m) override {
    auto bytes = m.payload_bytes();
    std::lock_guard<std::mutex> guard(link_->mutex);
    mailbox& out = link_->directions[side_];
    if (out.sender_closed)
      throw transport_error(transport_errc::cancelled,
                            "send on a closed inproc channel");
    if (out.receiver_closed)
      throw transport_error(transport_errc::peer_closed,
                            "inproc peer closed the channel");
    out.messages_sent += 1;
    out.bytes_sent += bytes;
    auto w = out.waiters.find(m.tag);
    if (w != out.waiters.end()) {
      while (!w->second.empty()) {
        waiter next = std::move(w->second.front());
        w->second.pop_front();
        if (next->complete(m)) {
          out.messages_delivered += 1;
          out.bytes_delivered += bytes;
          if (w->second.empty())
            out.waiters.erase(w);
          return;
        }
      }
      out.waiters.erase(w);
    }
    out.queued[m.tag].push_back(std::move(m));
  }

  pending_message recv_async(std::uint64_t tag) override {
    auto s = std::make_shared<pending_message::state>();
    s->tag = tag;
    std::lock_guard<std::mutex> guard(link_->mutex);
    mailbox& in = link_->directions[1 - side_];
    auto q = in.queued.find(tag);
    if (q != in.queued.end() && !q->second.empty()) {
      message m = std::move(q->second.front());
      q->second.pop_front();
      if (q->second.empty())
        in.queued.erase(q);
      in.messages_delivered += 1;
      in.bytes_delivered += m.payload_bytes();
      s->complete(m);
    } else if (in.receiver_closed) {
      s->fail(transport_error(transport_errc::cancelled,
                              "receive on a closed inproc channel"));
    } else if (in.sender_closed) {
      s->fail(transport_error(transport_errc::peer_closed,
                              "inproc peer closed the channel while tag " +
                                std::to_string(tag) + " was awaited"));
    } else {
      // Receives that timed out are still queued here; drop them so a loop
      // polling a quiet tag does not grow the list.
      auto& ws = in.waiters[tag];
      std::erase_if(ws, [](const waiter& w) { return w->ended(); });
      ws.push_back(s);
    }
    return pending_message(std::move(s));
  }

  void close() noexcept override {
    std::lock_guard<std::mutex> guard(link_->mutex);
    mailbox& out = link_->directions[side_];
    mailbox& in = link_->directions[1 - side_];
    if (out.sender_closed)
      return;
    out.sender_closed = true;
    in.receiver_closed = true;
    for (auto& [tag, ws] : in.waiters)
      for (auto& w : ws)
        w->fail(transport_error(transport_errc::cancelled,
                                "inproc channel closed while tag " +
                                  std::to_string(tag) + " was awaited"));
    in.waiters.clear();
    for (auto& [tag, ws] : out.waiters)
      for (auto& w : ws)
        w->fail(transport_error(transport_errc::peer_closed,
                                "inproc peer closed the channel while tag " +
                                  std::to_string(tag) + " was awaited"));
    out.waiters.clear();
  }

  std::string_view backend() const noexcept override { return "inproc"; }

  channel_stats stats() const override {
    std::lock_guard<std::mutex> guard(link_->mutex);
    const mailbox& out = link_->directions[side_];
    const mailbox& in = link_->directions[1 - side_];
    return {out.messages_sent, in.messages_delivered, out.bytes_sent,
            in.bytes_delivered};
  }

private:
  std::shared_ptr<link> link_;
  int side_;
};

} // namespace

std::pair<std::unique_ptr<channel>, std::unique_ptr<channel>> make_pair() {
  auto l = std::make_shared<link>();
  return {std::make_unique<endpoint>(l, 0), std::make_unique<endpoint>(l, 1)};
}

} // namespace h2::transport::inproc
