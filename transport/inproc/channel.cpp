#include "h2/transport/inproc/channel.hpp"

#include "h2/transport/mailbox.hpp"

#include <atomic>

namespace h2::transport::inproc {

namespace {

/// What both ends share: each end's mailbox and whether it is closed.
struct link {
  mailbox inbox[2];
  std::atomic<bool> closed[2] = {false, false};
  std::atomic<std::uint64_t> messages_sent[2] = {0, 0};
  std::atomic<std::uint64_t> bytes_sent[2] = {0, 0};
};

class endpoint final : public channel {
public:
  endpoint(std::shared_ptr<link> l, int side)
    : link_(std::move(l)), side_(side) {}

  ~endpoint() override { close(); }

  void send(message m) override {
    if (link_->closed[side_].load())
      throw transport_error(transport_errc::cancelled,
                            "send on a closed inproc channel");
    if (link_->closed[1 - side_].load())
      throw transport_error(transport_errc::peer_closed,
                            "inproc peer closed the channel");
    link_->messages_sent[side_] += 1;
    link_->bytes_sent[side_] += m.payload_bytes();
    link_->inbox[1 - side_].deliver(std::move(m));
  }

  pending_message recv_async(std::uint64_t tag) override {
    return link_->inbox[side_].receive(tag);
  }

  void close() noexcept override {
    if (link_->closed[side_].exchange(true))
      return;
    link_->inbox[side_].cancel("inproc channel closed");
    link_->inbox[1 - side_].fail(transport_error(
      transport_errc::peer_closed, "inproc peer closed the channel"));
  }

  std::string_view backend() const noexcept override { return "inproc"; }

  channel_stats stats() const override {
    const auto& in = link_->inbox[side_];
    return {link_->messages_sent[side_].load(), in.messages_delivered(),
            link_->bytes_sent[side_].load(), in.bytes_delivered()};
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
