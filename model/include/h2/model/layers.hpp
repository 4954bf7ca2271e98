// The model's layers: embedding, pre-norm transformer block, head, of the
// gpt2 family (layers.cpp) or the llama family (llama.cpp). Each
// global layer owns its parameters and their AdamW state, so a layer can move
// between stages with everything it needs (docs/architecture.md, step 5).
//
// Initial weights depend only on (seed, global layer index): every partition
// of the model starts from the same weights.
#pragma once

#include "h2/core/model_config.hpp"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace h2::model {

/// Where a layer's first weights come from: drawn from (seed, global layer
/// index), or given (a layer that moved from another chip).
struct initial_weights {
  /// A seed draws: the implicit conversion keeps make_layer(cfg, i, seed).
  initial_weights(std::uint64_t s) noexcept : seed(s) {} // NOLINT
  /// The parameters are `values` itself, a flat fp32 tensor of the
  /// layer's parameter count on the layer's device: each parameter's
  /// tensor aliases the next elements of it, in the order the layer lists
  /// them (no copy), as a drawn layer's alias the buffer make_layer()
  /// allocates.
  static initial_weights over(at::Tensor values) {
    initial_weights w(0);
    w.values = std::move(values);
    return w;
  }
  std::uint64_t seed = 0;
  at::Tensor values; ///< defined: over()
};

/// One trainable tensor with its optimizer state.
struct parameter {
  std::string name;      ///< "block3.attn.qkv.weight"
  at::Tensor value;      ///< fp32 master weight, requires_grad
  bool decay = false;    ///< weight decay applies (matrices, not biases/norms)
  at::Tensor exp_avg;    ///< AdamW first moment (allocated on first step)
  at::Tensor exp_avg_sq; ///< AdamW second moment (allocated on first step)
  /// ZeRO-1 (docs/planner.md, "Sharded optimizer state"): the moments are
  /// flat, of elements [shard_offset, shard_offset + shard_length) of
  /// `value` flattened, and AdamW updates only those. -1: not sharded, the
  /// moments have value's shape.
  std::int64_t shard_offset = 0;
  std::int64_t shard_length = -1;
  /// The head's copy of a tied embedding (gpt_config::tie_embeddings): its
  /// gradient is summed with the embedding's, and it is not counted again
  /// in the global gradient norm.
  bool tied = false;
};

/// The tokens and targets of one micro-batch.
struct micro_batch {
  at::Tensor tokens;  ///< [sequences, seq_len] int64 inputs
  at::Tensor targets; ///< [sequences, seq_len] int64 next tokens
  /// Multiplies the summed token losses: 1 / tokens in the global batch,
  /// so the step's loss is the mean over every token (docs/architecture.md, "Loss").
  double loss_scale = 1.0;
};

/// One global layer of the model.
class layer {
public:
  virtual ~layer() = default;

  /// Embedding: ignores `input`, embeds `mb.tokens` -> [B, T, d].
  /// Block: [B, T, d] -> [B, T, d].
  /// Head: [B, T, d] -> scalar loss (sum of token cross-entropies times
  /// mb.loss_scale), computed in fp32.
  virtual at::Tensor forward(const at::Tensor& input,
                             const micro_batch& mb) = 0;

  int index() const noexcept { return index_; }
  layer_kind kind() const noexcept { return kind_; }
  std::vector<parameter>& parameters() noexcept { return params_; }
  const std::vector<parameter>& parameters() const noexcept { return params_; }

  /// Number of scalar parameters.
  std::int64_t parameter_count() const;

  /// Blocks: whether the attention core is recomputed in the backward
  /// rather than kept (recompute_policy::attention); others ignore it.
  void set_attention_recompute(bool on) noexcept { attention_recompute_ = on; }
  bool attention_recompute() const noexcept { return attention_recompute_; }

protected:
  layer(int index, layer_kind kind) : index_(index), kind_(kind) {}

  /// Adds a parameter; returns its tensor.
  at::Tensor& add(std::string name, at::Tensor value, bool decay);

private:
  int index_;
  layer_kind kind_;
  bool attention_recompute_ = false;
  std::vector<parameter> params_;
};

/// The logits the head computes its loss from: final norm, then the LM
/// head (no bias); [B, T, d] -> [B, T, vocab] in `input`'s dtype. `head`
/// must be the head layer (else h2::internal_error). For tools and tests
/// that check H2's forward pass against another implementation
/// (docs/export.md).
at::Tensor head_logits(const layer& head, const at::Tensor& input);

/// Builds global layer `index` of `cfg` on `device` with weights drawn
/// from (seed, index) on the host: the same bits on every device; or, for
/// initial_weights::over(), over the given values (which must live on
/// `device`). Either way the parameters' values are slices of one flat
/// buffer, in order (flat_values()). Host tensors are allocated on the calling
/// thread (and so are charged to the chip bound to it).
std::unique_ptr<layer> make_layer(const gpt_config& cfg, int index,
                                  initial_weights seed,
                                  c10::Device device = c10::kCPU);

/// `l`'s parameters' values as one flat fp32 tensor, in the order l lists
/// them: the buffer they live in, when they are its slices in order (as
/// make_layer() makes them; no copy), else a packed copy. Not requiring
/// grad.
at::Tensor flat_values(const layer& l);

/// `l`'s AdamW moments likewise, each parameter's exp_avg then its
/// exp_avg_sq (make_moments() puts them so); undefined before the
/// optimizer has run. Throws h2::internal_error for ZeRO-1's shares or for
/// moments of some parameters only.
at::Tensor flat_moments(const layer& l);

} // namespace h2::model
