// Live re-plans that move layers chip to chip (docs/rebalance.md): which
// layers leave and reach each chip when a job moves from one plan to
// another, and a moved layer's state as it crosses a channel. No actors:
// each chip works out its own part from the two plans
// (stage_worker::migrate), and the scheduler the same to decide the route.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/model/layers.hpp"
#include "h2/scheduler/rebalance.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace h2::runtime {

/// One layer that leaves a chip (a send) or reaches it (a receive).
struct layer_transfer {
  int layer = 0;
  chip_id peer; ///< its new owner (a send) or its old one (a receive)
};

/// One chip's part in a live re-plan.
struct chip_migration {
  std::vector<layer_transfer> sends;    ///< in layer order
  std::vector<layer_transfer> receives; ///< in layer order
};

/// What moving a job from one plan to another asks of its chips.
struct migration {
  /// Every chip of the plans, those that keep all their layers too.
  std::map<chip_id, chip_migration> chips;
  /// The same moves by range, with their bytes and link time
  /// (scheduler::layer_moves).
  std::vector<scheduler::layer_move> moves;
  /// Why the layers cannot go straight from their old owner to their new
  /// one, and so go through the scheduler: "" when they can.
  std::string indirect;
};

/// The layers of every replica that change owner from plan `from` to plan
/// `to` (the same replicas with the same chips: throws h2::internal_error
/// otherwise), chip by chip. Throws h2::error naming the two chips when
/// `to` would give a chip a neighbour it shares no channel with under
/// `from`. They can go chip to chip when every move is
/// between two chips that share a channel under `from` (pipeline, tied
/// embedding or ring neighbours) and neither plan shards the optimizer
/// state (ZeRO-1 shards a layer's moments by plan-dependent rings).
migration migration_of(const job_config& job, const plan& from, const plan& to);

/// The channel tag of layer `layer`'s state moving before step `step`.
std::uint64_t layer_move_tag(std::int64_t step, int layer);

/// `l`'s state as one flat fp32 tensor on its device: each parameter's
/// values, then, once the optimizer has run, each one's first and second
/// AdamW moment (l's parameters in order). Throws h2::internal_error for a
/// parameter with sharded moments.
at::Tensor pack_layer(const model::layer& l);

/// Layer `index` of `cfg` on `device` from a received pack_layer() tensor
/// of it: one copy into a buffer allocated on the calling thread (so
/// charged to the chip bound to it), which the layer's parameters and
/// moments then alias. Throws checkpoint_error(mismatch) naming the layer
/// when `received` is not an fp32 vector of the layer's values (with or
/// without both moments).
std::unique_ptr<model::layer> unpack_layer(const gpt_config& cfg, int index,
                                           const at::Tensor& received,
                                           c10::Device device = c10::kCPU);

} // namespace h2::runtime
