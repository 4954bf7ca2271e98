// The model's shape and the arithmetic of its layers (FLOPs, bytes,
// parameters), shared by the emulated chips' cost functions and the planner.
// No libtorch here: the model itself lives in model/.
#pragma once

#include "h2/core/profile.hpp"

#include <cstdint>
#include <string_view>

namespace h2 {

/// The two block designs H2 trains (docs/job-file.md, [model]).
enum class model_family {
  /// GPT-2: learned positions, LayerNorm with biases, GELU MLP, biased
  /// projections, multi-head attention.
  gpt2,
  /// Llama: rotary positions, RMSNorm, SwiGLU MLP, no biases,
  /// grouped-query attention.
  llama,
};

/// "gpt2", "llama".
std::string_view to_string(model_family family) noexcept;

/// What logs call a model of `family`: "GPT", "Llama".
std::string_view display_name(model_family family) noexcept;

/// A decoder-only transformer. Its layers, in pipeline order, are
/// 0 = embedding (token, plus position for gpt2), 1..n_layer = blocks,
/// n_layer + 1 = head (final norm + LM head + loss).
struct gpt_config {
  int vocab_size = 0;
  int seq_len = 0; ///< tokens per sequence (context length)
  int d_model = 0;
  int n_head = 0;
  int n_layer = 0; ///< transformer blocks
  int d_ff = 0;    ///< MLP hidden width
  model_family family = model_family::gpt2;
  /// Key/value heads (llama's grouped-query attention; gpt2: n_head).
  /// Divides n_head.
  int n_kv_head = 0;
  double rope_theta = 10000.0; ///< llama: the rotary embedding's base
  double norm_eps = 1e-5;      ///< every LayerNorm's or RMSNorm's epsilon
  /// The LM head's weight is the token embedding's: the head keeps a copy,
  /// equal at every step (their gradients are summed, docs/job-file.md).
  bool tie_embeddings = false;

  /// Layers of the pipeline: n_layer blocks plus embedding and head.
  int num_layers() const noexcept { return n_layer + 2; }
  /// Width of one attention head.
  int head_dim() const noexcept { return d_model / n_head; }
  /// Key/value heads: n_kv_head, or n_head when it is unset (0).
  int kv_heads() const noexcept { return n_kv_head > 0 ? n_kv_head : n_head; }
};

/// Llama's default MLP width for `d_model`: 8 d_model / 3 rounded up to a
/// multiple of 64 (the SwiGLU MLP's three matrices then hold about the
/// parameters of GPT-2's two of width 4 d_model).
int default_llama_d_ff(int d_model) noexcept;

enum class layer_kind { embedding, block, head };

/// "embedding", "block", "head".
std::string_view to_string(layer_kind kind) noexcept;

/// The kind of global layer `layer` (0 <= layer < num_layers()).
layer_kind kind_of_layer(const gpt_config& cfg, int layer);

/// Parameters of one global layer. The head counts its LM head weight also
/// when it is tied to the embedding (the head's chip holds a copy).
std::int64_t layer_parameters(const gpt_config& cfg, int layer);

/// Parameters of the whole model.
std::int64_t model_parameters(const gpt_config& cfg);

/// The work of one layer on one micro-batch of `micro_batch` sequences in
/// dtype `d`: what a roofline cost function needs.
struct layer_work {
  layer_kind kind = layer_kind::block;
  double rows = 0;           ///< tokens in the micro-batch (GEMM M dimension)
  double forward_flops = 0;  ///< dense FLOPs of the forward pass
  double backward_flops = 0; ///< dense FLOPs of the backward pass
  /// Of backward_flops, the weight gradients' (W of a split backward; the
  /// rest is B, the input gradients).
  double weight_gradient_flops = 0;
  double forward_bytes = 0;  ///< memory traffic of the forward pass
  double backward_bytes = 0; ///< memory traffic of the backward pass
  std::int64_t parameters = 0;
};

/// Analytic FLOPs and bytes of `layer` for a micro-batch (attention counted
/// in full, as dense kernels compute it).
layer_work compute_layer_work(const gpt_config& cfg, int layer, int micro_batch,
                              dtype d);

/// The attention core of a block (softmax(q k^T) v over a micro-batch of
/// `micro_batch` sequences): its forward FLOPs and bytes, what recomputing
/// it adds to the block's backward (recompute_policy::attention).
layer_work attention_core_work(const gpt_config& cfg, int micro_batch, dtype d);

/// The share of `w`'s backward that computes weight gradients (W of a
/// split backward): weight_gradient_flops / backward_flops, 0 without
/// backward FLOPs.
double weight_gradient_share(const layer_work& w) noexcept;

/// FLOPs of one training step of the whole model on `tokens` tokens
/// (forward + backward, the 6N-plus-attention rule).
double training_flops(const gpt_config& cfg, double tokens);

} // namespace h2
