// Live re-plans that move layers chip to chip (docs/rebalance.md): which
// layers leave and reach each chip when a job moves from one plan to
// another, and a moved layer's state as it crosses a channel. No actors:
// each chip works out its own part from the two plans
// (stage_worker::migrate), and the scheduler the same to decide the route.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/layers.hpp"
#include "h2/scheduler/rebalance.hpp"
#include "h2/transport/channel.hpp"

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

/// Chip `chip`'s part of migration_of(job, from, to), without its checks
/// and route: what a chip works out once the scheduler has chosen the route
/// chip to chip (a layer to a peer it has no channel to still fails there,
/// naming both chips).
chip_migration chip_part_of(const job_config& job, const plan& from,
                            const plan& to, const chip_id& chip);

/// The channel tag of layer `layer`'s state moving before step `step`.
std::uint64_t layer_move_tag(std::int64_t step, int layer);

/// Gives layer `l` up to move it: its state as the moved_state_messages
/// messages that carry it, its values (model::flat_values), then both AdamW
/// moments of each parameter (model::flat_moments), undefined before the
/// optimizer has run (sent as an empty message). Each a flat fp32 tensor,
/// the very buffer the layer lived in where it was one (make_layer's and
/// make_moments' layout: no copy). `l` is gone first, so each message is its
/// buffer's one holder (in one process the receiver takes it over as it
/// is), and the buffers are charged to no chip until a receiver takes them
/// (the giver's memory drops now). Throws h2::internal_error for sharded
/// moments.
std::vector<at::Tensor> give_up_layer(std::unique_ptr<model::layer> l);

/// How many messages carry a moved layer's state.
inline constexpr std::size_t moved_state_messages = 2;

/// Layer `index` of `cfg` on `device` from its give_up_layer() messages, in
/// order. Each becomes the chip's own by device.own() (called on a thread
/// bound to it): in one process the sender's buffer itself, its charge
/// moved, no copy; otherwise one copy. The layer's parameters and moments
/// alias those buffers, nothing is drawn. Throws
/// checkpoint_error(mismatch) naming the layer when the messages are not
/// its state (another count of values, another type, too few messages).
std::unique_ptr<model::layer>
take_over_layer(const gpt_config& cfg, int index,
                std::vector<transport::message> received,
                const devices::device_context& device);

} // namespace h2::runtime
