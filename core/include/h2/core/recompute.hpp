// What a stage recomputes in its backward instead of keeping it from its
// forward (docs/planner.md, "Recomputation"): nothing, the whole stage,
// whole blocks, or the attention core of its blocks (Megatron-LM's selective
// recomputation). One text form serves job files, plan files and reports.
#pragma once

#include "h2/core/model_config.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace h2 {

struct recompute_policy {
  /// The whole stage from its input (its output is dropped after the
  /// forward); `blocks` and `attention` are then unused.
  bool full = false;
  /// Otherwise: the stage's first `blocks` transformer blocks, each from its
  /// own input,
  int blocks = 0;
  /// and the attention core (softmax(q k^T) v, whose probabilities are the
  /// largest activation) of the stage's other blocks.
  bool attention = false;

  static recompute_policy none() noexcept { return {}; }
  static recompute_policy whole() noexcept { return {true, 0, false}; }

  bool any() const noexcept { return full || blocks > 0 || attention; }
  bool operator==(const recompute_policy&) const = default;
};

/// "none", "full", "attention", "2 blocks", "2 blocks + attention".
std::string to_string(const recompute_policy& p);

/// The inverse of to_string (spaces optional, "1 block" accepted); nullopt
/// for anything else.
std::optional<recompute_policy> parse_recompute(std::string_view text);

/// What a policy runs again of one layer of its stage.
enum class recomputed_part {
  nothing,
  forward,   ///< the layer's whole forward
  attention, ///< the block's attention core
};

/// What `p` recomputes of a stage's layer of kind `kind`; `block` counts
/// the stage's blocks before it (its own index among them). The one rule
/// the runtime, the cost model and the live calibration share.
recomputed_part recomputed_part_of(const recompute_policy& p, layer_kind kind,
                                   int block) noexcept;

/// The forward work `p` runs again in the backward of a stage of `layers`
/// (in stage order), as `forward_of` measures a layer_work (seconds or
/// FLOPs): recomputed_part_of() each layer, `attention` (the stage's
/// attention_core_work()) standing for an attention core.
template <class Forward>
double recomputed_forward(const recompute_policy& p,
                          const std::vector<layer_work>& layers,
                          const layer_work& attention, Forward&& forward_of) {
  double out = 0;
  int blocks = 0;
  for (const auto& w : layers) {
    switch (recomputed_part_of(p, w.kind, blocks)) {
      case recomputed_part::forward:
        out += forward_of(w);
        break;
      case recomputed_part::attention:
        out += forward_of(attention);
        break;
      case recomputed_part::nothing:
        break;
    }
    blocks += w.kind == layer_kind::block ? 1 : 0;
  }
  return out;
}

/// What parse_recompute accepts, for error messages.
inline constexpr std::string_view recompute_choices =
  "\"none\", \"full\", \"attention\", \"<n> blocks\" or "
  "\"<n> blocks + attention\"";

} // namespace h2
