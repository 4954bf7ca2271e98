// Live re-plans chip to chip (docs/rebalance.md, "Moving layers").
#include "h2/runtime/migration.hpp"

#include "h2/core/error.hpp"
#include "h2/model/optim.hpp"
#include "h2/runtime/safetensors.hpp" // checkpoint_error
#include "h2/runtime/stage_worker.hpp"
#include "h2/transport/collectives.hpp"

#include <set>
#include <sstream>
#include <utility>

namespace h2::runtime {

namespace {

/// The group number of collective_tag that moved layers use (no reduction
/// group reaches it; tied embeddings use 4095).
constexpr int layer_move_group = 4094;

} // namespace

chip_migration chip_part_of(const job_config& job, const plan& from,
                            const plan& to, const chip_id& chip) {
  chip_migration out;
  for (const auto& m : scheduler::layer_moves(job, from, to))
    for (int l = m.first_layer; l < m.end_layer; ++l) {
      if (m.from == chip)
        out.sends.push_back({l, m.to});
      if (m.to == chip)
        out.receives.push_back({l, m.from});
    }
  return out;
}

migration migration_of(const job_config& job, const plan& from,
                       const plan& to) {
  migration out;
  if (from.shards_optimizer() || to.shards_optimizer())
    out.indirect = "ZeRO-1 shards the moved layers' optimizer state";
  // Who shares a channel under `from`: the setups' peers (a non-owning
  // pointer to `job`, which outlives them).
  std::set<std::pair<chip_id, chip_id>> linked;
  const std::shared_ptr<const job_config> shared(std::shared_ptr<void>(), &job);
  for (const auto& w : make_worker_setups(shared, from, {}, nullptr)) {
    out.chips[w.chip->id];
    for (const auto& [peer, link] : w.peers)
      linked.emplace(w.chip->id, peer);
  }
  // Checked before anything moves, by either route.
  for (const auto& w : make_worker_setups(shared, to, {}, nullptr))
    for (const auto& [peer, link] : w.peers)
      if (linked.count({w.chip->id, peer}) == 0)
        throw error("a live re-plan keeps every chip's neighbours; chip " +
                    w.chip->id.to_string() + " would need one to " +
                    peer.to_string() +
                    " (that needs a checkpoint and a restart)");
  out.moves = scheduler::layer_moves(job, from, to);
  for (const auto& m : out.moves) {
    for (int l = m.first_layer; l < m.end_layer; ++l) {
      out.chips[m.from].sends.push_back({l, m.to});
      out.chips[m.to].receives.push_back({l, m.from});
    }
    if (out.indirect.empty() && linked.count({m.from, m.to}) == 0)
      out.indirect = "layers [" + std::to_string(m.first_layer) + ", " +
                     std::to_string(m.end_layer) + ") move from " +
                     m.from.to_string() + " to " + m.to.to_string() +
                     ", which share no channel";
  }
  return out;
}

std::uint64_t layer_move_tag(std::int64_t step, int layer) {
  return transport::collective_tag(step, layer_move_group, layer >> 12,
                                   layer & 4095);
}

std::vector<at::Tensor> give_up_layer(std::unique_ptr<model::layer> l) {
  for (const auto& p : l->parameters())
    H2_ENFORCE(p.shard_length < 0, "layer ", l->index(), ", ", p.name,
               ": sharded moments do not move chip to chip");
  std::vector<at::Tensor> out{model::flat_values(*l), model::flat_moments(*l)};
  l.reset();
  for (const auto& t : out)
    devices::move_charge(t, nullptr); // held elsewhere too: stays charged
  return out;
}

namespace {

/// Why `m` is not a flat fp32 tensor of `values` elements: "" when it is.
std::string state_mismatch(const transport::message& m, std::int64_t values) {
  const auto& t = m.tensor;
  if (t.defined() && t.scalar_type() == at::kFloat && t.dim() == 1 &&
      t.numel() == values && t.is_contiguous())
    return "";
  std::ostringstream out;
  out << values << " contiguous fp32 values expected, got ";
  if (!t.defined())
    out << "a message of " << m.bytes.size() << " bytes";
  else
    out << (t.is_contiguous() ? "" : "non-contiguous ") << t.sizes() << " of "
        << c10::toString(t.scalar_type());
  return out.str();
}

} // namespace

std::unique_ptr<model::layer>
take_over_layer(const gpt_config& cfg, int index,
                std::vector<transport::message> received,
                const devices::device_context& device) {
  const std::int64_t values = layer_parameters(cfg, index);
  const auto where = "layer " + std::to_string(index);
  auto refuse = [&](const std::string& what) {
    throw checkpoint_error(checkpoint_errc::mismatch, "", where + what);
  };
  if (received.size() != moved_state_messages)
    refuse(": " + std::to_string(moved_state_messages) +
           " messages of its state expected, " +
           std::to_string(received.size()) + " came");
  if (const auto why = state_mismatch(received[0], values); !why.empty())
    refuse(", its values: " + why);
  const auto& moments = received[1];
  const bool before_update = !moments.tensor.defined() && moments.bytes.empty();
  if (!before_update)
    if (const auto why = state_mismatch(moments, 2 * values); !why.empty())
      refuse(", its AdamW moments: " + why);
  auto l = model::make_layer(
    cfg, index, model::initial_weights::over(device.own(received[0].tensor)),
    device.torch_device());
  if (!before_update) // else the optimizer makes them
    model::make_moments(*l, device.own(moments.tensor));
  return l;
}

} // namespace h2::runtime
