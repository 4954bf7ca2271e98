// A live re-plan in place (docs/rebalance.md, "Moving layers"): the chip
// sends the layers it gives up straight to their new owners, receives the
// ones it takes over, and keeps the rest without copying them.
#include "h2/runtime/stage_worker.hpp"

#include "stage_worker_context.hpp"

#include <map>

namespace h2::runtime {

namespace {

/// Bytes sent so far over the channels of `peers`.
std::uint64_t bytes_sent_to(const std::map<chip_id, peer_link>& peers) {
  std::uint64_t out = 0;
  for (const auto& [peer, link] : peers)
    if (link.channel)
      out += link.channel->stats().bytes_sent;
  return out;
}

} // namespace

std::uint64_t stage_worker::migrate(worker_setup next, const chip_migration& m,
                                    std::int64_t step) {
  return guarded([&] {
    devices::thread_binding bind(*device_);
    const auto& model = setup_.job->model;
    const auto& me = device_->id();
    // ZeRO-1's shares follow the plan's rings: its re-plans go through the
    // scheduler (migration_of).
    H2_ENFORCE(!setup_.zero1 && !next.zero1, "chip ", me.to_string(),
               ": sharded optimizer state does not move chip to chip");
    auto channel_to = [&](const chip_id& peer) -> transport::channel& {
      auto it = setup_.peers.find(peer);
      H2_ENFORCE(it != setup_.peers.end() && it->second.channel, "chip ",
                 me.to_string(), " has no channel to ", peer.to_string(),
                 " to move layers over");
      return *it->second.channel;
    };
    // Receives first, so that what arrives finds them waiting.
    std::vector<std::pair<int, transport::pending_message>> incoming;
    for (const auto& r : m.receives)
      incoming.emplace_back(
        r.layer, channel_to(r.peer).recv_async(layer_move_tag(step, r.layer)));
    std::map<int, std::unique_ptr<model::layer>> held;
    for (auto& c : chunks_)
      for (auto& l : c->release_layers()) {
        const int index = l->index();
        held[index] = std::move(l);
      }
    chunks_.clear();
    layers_.clear();
    const auto sent_before = bytes_sent_to(setup_.peers);
    for (const auto& s : m.sends) {
      auto it = held.find(s.layer);
      H2_ENFORCE(it != held.end(), "chip ", me.to_string(),
                 " is to move layer ", s.layer, ", which it does not hold");
      transport::message msg;
      msg.tag = layer_move_tag(step, s.layer);
      msg.tensor = pack_layer(*it->second);
      held.erase(it); // its memory goes as soon as the channel lets go
      channel_to(s.peer).send(std::move(msg));
    }
    const auto sent = bytes_sent_to(setup_.peers) - sent_before;
    for (auto& [index, pending] : incoming) {
      const auto msg = pending.get(timeout_);
      held[index] =
        unpack_layer(model, index, msg.tensor, device_->torch_device());
    }
    setup_ = std::move(next);
    for (const auto& c : setup_.chunks) {
      std::vector<std::unique_ptr<model::layer>> layers;
      for (int l = c.first_layer; l < c.end_layer; ++l) {
        auto it = held.find(l);
        H2_ENFORCE(it != held.end(), "chip ", me.to_string(), " lacks layer ",
                   l, " of its chunk [", c.first_layer, ", ", c.end_layer,
                   ") after moving layers");
        layers.push_back(std::move(it->second));
        held.erase(it);
      }
      chunks_.push_back(std::make_unique<model::stage>(
        model, c.first_layer, c.end_layer, std::move(layers),
        device_->torch_device()));
    }
    H2_ENFORCE(held.empty(), "chip ", me.to_string(), " still holds layer ",
               held.empty() ? -1 : held.begin()->first,
               ", which the new plan places elsewhere");
    adopt_plan();
    device_->reset_peak(); // the new stage's peak, as a rebuilt chip's
    return sent;
  });
}

} // namespace h2::runtime
