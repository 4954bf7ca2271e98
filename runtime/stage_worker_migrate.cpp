// A live re-plan in place (docs/rebalance.md, "Moving layers"): the chip
// sends the layers it gives up straight to their new owners, receives the
// ones it takes over, and keeps the rest without copying them.
#include "h2/runtime/stage_worker.hpp"

#include "stage_worker_context.hpp"

#include <algorithm>
#include <chrono>
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
    std::vector<std::pair<int, std::vector<transport::pending_message>>>
      incoming;
    for (const auto& r : m.receives) {
      auto& [index, parts] = incoming.emplace_back(
        r.layer, std::vector<transport::pending_message>{});
      auto& channel = channel_to(r.peer);
      const auto tag = layer_move_tag(step, r.layer);
      for (auto k = moved_state_messages; k > 0; --k)
        parts.push_back(channel.recv_async(tag));
    }
    for (const auto& s : m.sends) // before anything is let go of
      channel_to(s.peer);
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
      // Its charge leaves this chip now, not once the receiver has taken
      // it over, so that this chip's report after the move is what it holds.
      auto state = give_up_layer(std::move(it->second));
      held.erase(it);
      auto& channel = channel_to(s.peer);
      for (auto& t : state) {
        transport::message msg;
        msg.tag = layer_move_tag(step, s.layer);
        msg.tensor = std::move(t);
        channel.send(std::move(msg));
      }
    }
    const auto sent = bytes_sent_to(setup_.peers) - sent_before;
    for (auto& [index, parts] : incoming) {
      // One bound for the layer, however many messages carry it.
      using clock = std::chrono::steady_clock;
      const auto deadline =
        clock::now() + std::chrono::duration_cast<clock::duration>(timeout_);
      // Last first: one tag keeps its order, so once the last message is
      // in so is the first, and the chip wakes once per layer.
      std::vector<transport::message> state(parts.size());
      for (std::size_t k = parts.size(); k-- > 0;)
        state[k] = parts[k].get(
          std::max(deadline - clock::now(), clock::duration::zero()));
      held[index] = take_over_layer(model, index, std::move(state), *device_);
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
