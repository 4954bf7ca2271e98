#include "link.hpp"

namespace h2::transport::inproc {

namespace {

class link_end final : public channel {
public:
  link_end(std::shared_ptr<link> l, int side)
      : link_(std::move(l)), side_(side) {}

  ~link_end() override { close(); }

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

std::unique_ptr<channel> make_end(std::shared_ptr<link> l, int side) {
  return std::make_unique<link_end>(std::move(l), side);
}

} // namespace h2::transport::inproc
