// Live re-plans chip to chip (docs/rebalance.md, "Moving layers").
#include "h2/runtime/migration.hpp"

#include "h2/core/error.hpp"
#include "h2/runtime/safetensors.hpp" // checkpoint_error
#include "h2/runtime/stage_worker.hpp"
#include "h2/transport/collectives.hpp"

#include <ATen/ops/empty.h>

#include <cstring>
#include <set>
#include <utility>

namespace h2::runtime {

namespace {

/// The group number of collective_tag that moved layers use (no reduction
/// group reaches it; tied embeddings use 4095).
constexpr int layer_move_group = 4094;

} // namespace

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

at::Tensor pack_layer(const model::layer& l) {
  std::vector<const at::Tensor*> parts;
  bool moments = false;
  for (const auto& p : l.parameters()) {
    H2_ENFORCE(p.shard_length < 0, "layer ", l.index(), ", ", p.name,
               ": sharded moments do not move chip to chip");
    parts.push_back(&p.value);
    moments = moments || p.exp_avg.defined();
  }
  if (moments)
    for (const auto& p : l.parameters()) {
      H2_ENFORCE(p.exp_avg.defined() && p.exp_avg_sq.defined(), "layer ",
                 l.index(), ", ", p.name, ": no AdamW moments");
      parts.push_back(&p.exp_avg);
      parts.push_back(&p.exp_avg_sq);
    }
  std::int64_t total = 0;
  for (const auto* t : parts)
    total += t->numel();
  H2_ENFORCE(!parts.empty(), "layer ", l.index(), " has no parameters");
  auto out = at::empty(
    {total}, parts.front()->options().dtype(at::kFloat).requires_grad(false));
  // Host tensors by memcpy: a dozen library ops per parameter cost more
  // than the copy itself at small widths.
  std::int64_t at = 0;
  for (const auto* t : parts) {
    H2_ENFORCE(t->scalar_type() == at::kFloat, "layer ", l.index(),
               ": state is fp32");
    if (out.is_cpu() && t->is_cpu() && t->is_contiguous())
      std::memcpy(out.data_ptr<float>() + at, t->data_ptr<float>(),
                  static_cast<std::size_t>(t->numel()) * sizeof(float));
    else
      out.narrow(0, at, t->numel()).copy_(t->detach().reshape({-1}));
    at += t->numel();
  }
  return out;
}

std::unique_ptr<model::layer> unpack_layer(const gpt_config& cfg, int index,
                                           const at::Tensor& received,
                                           c10::Device device) {
  const std::int64_t values = layer_parameters(cfg, index);
  const auto where = "layer " + std::to_string(index);
  if (!received.defined() || received.scalar_type() != at::kFloat ||
      received.dim() != 1 ||
      (received.numel() != values && received.numel() != 3 * values))
    throw checkpoint_error(
      checkpoint_errc::mismatch, "",
      where + ": a moved state of " + std::to_string(values) +
        " fp32 values (or 3 times as many, with the AdamW moments) "
        "expected, got " +
        (received.defined() ? std::to_string(received.numel()) + " of " +
                                c10::toString(received.scalar_type())
                            : std::string("no tensor")));
  // A buffer of this chip's own: what arrived is the sender's memory (in
  // one process) or a peer's shared memory (shm), charged and written there.
  auto own =
    at::empty({received.numel()}, at::TensorOptions(at::kFloat).device(device));
  own.copy_(received);
  auto l = model::make_layer(
    cfg, index, model::initial_weights::over(own.narrow(0, 0, values)), device);
  H2_ENFORCE(l->parameter_count() == values, where, " has ",
             l->parameter_count(), " parameters, its size says ", values);
  if (received.numel() == values)
    return l; // before the first update: the optimizer makes the moments
  std::int64_t at = values;
  auto next = [&](const at::Tensor& like) {
    auto part = own.narrow(0, at, like.numel()).view(like.sizes());
    at += like.numel();
    return part;
  };
  for (auto& p : l->parameters()) {
    p.exp_avg = next(p.value);
    p.exp_avg_sq = next(p.value);
  }
  return l;
}

} // namespace h2::runtime
