// Per-layer state (docs/checkpoints.md): a layer's parameters and AdamW
// moments, keyed by its global layer index and independent of stages, so
// that a state taken under one plan loads under any other. Checkpoints
// store it; live rebalancing moves it between chips.
#pragma once

#include "h2/devices/device_context.hpp"
#include "h2/model/layers.hpp"
#include "h2/runtime/safetensors.hpp"

#include <map>
#include <string>

namespace h2::runtime {

/// Host copies (device.to_host) of `l`'s parameters (fp32 master weights)
/// and, once the optimizer has run, its AdamW moments ("<param>.exp_avg",
/// "<param>.exp_avg_sq"). `l` lives on `device`, which is bound to the
/// thread. A parameter whose moments are sharded (ZeRO-1,
/// parameter::shard_length) takes its whole moments from `gathered`, by
/// name, which the chip gathered from its reduction group (none there:
/// before the first update).
layer_state
snapshot_layer(const devices::device_context& device, const model::layer& l,
               std::map<std::string, state_tensor>* gathered = nullptr);

/// A host copy of the fp32 tensor `t` of `device` as tensor `name` of a
/// layer state.
state_tensor host_copy(const devices::device_context& device,
                       const std::string& name, const at::Tensor& t);

/// Overwrites `l`'s parameters and moments with `s` (without moments: the
/// state before the first update, and `l`'s moments are dropped). Copies
/// into the existing tensors (through device.to_device), so they stay on
/// `l`'s chip, `device`, which is bound to the thread; a sharded
/// parameter keeps only its share of the moments. Throws
/// checkpoint_error(mismatch) naming the layer and tensor when `s` is for
/// another layer, lacks a parameter, has a tensor `l` lacks, or a shape or
/// dtype differs.
void restore_layer(const devices::device_context& device, model::layer& l,
                   const layer_state& s);

} // namespace h2::runtime
