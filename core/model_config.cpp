#include "h2/core/model_config.hpp"

#include "h2/core/error.hpp"

namespace h2 {

std::string_view to_string(layer_kind kind) noexcept {
  switch (kind) {
    case layer_kind::embedding:
      return "embedding";
    case layer_kind::block:
      return "block";
    case layer_kind::head:
      return "head";
  }
  return "unknown";
}

std::string_view to_string(model_family family) noexcept {
  switch (family) {
    case model_family::gpt2:
      return "gpt2";
    case model_family::llama:
      return "llama";
  }
  return "unknown";
}

std::string_view display_name(model_family family) noexcept {
  return family == model_family::llama ? "Llama" : "GPT";
}

int default_llama_d_ff(int d_model) noexcept {
  const std::int64_t f = (8 * static_cast<std::int64_t>(d_model) + 2) / 3;
  return static_cast<int>((f + 63) / 64 * 64);
}

layer_kind kind_of_layer(const gpt_config& cfg, int layer) {
  H2_ENFORCE(layer >= 0 && layer < cfg.num_layers(), "layer=", layer,
             " num_layers=", cfg.num_layers());
  if (layer == 0)
    return layer_kind::embedding;
  if (layer == cfg.n_layer + 1)
    return layer_kind::head;
  return layer_kind::block;
}

std::int64_t layer_parameters(const gpt_config& cfg, int layer) {
  const std::int64_t d = cfg.d_model, f = cfg.d_ff, v = cfg.vocab_size,
                     t = cfg.seq_len;
  if (cfg.family == model_family::llama) {
    const std::int64_t kv = std::int64_t{cfg.kv_heads()} * cfg.head_dim();
    switch (kind_of_layer(cfg, layer)) {
      case layer_kind::embedding:
        return v * d; // no position table: rotary positions
      case layer_kind::block:
        // two RMSNorms, q, k, v, o, and the MLP's gate, up and down
        return 2 * d + 2 * d * d + 2 * d * kv + 3 * d * f;
      case layer_kind::head:
        return d + v * d; // final RMSNorm + LM head
    }
  }
  switch (kind_of_layer(cfg, layer)) {
    case layer_kind::embedding:
      return v * d + t * d;
    case layer_kind::block:
      // ln1, qkv (+bias), proj (+bias), ln2, fc1 (+bias), fc2 (+bias)
      return 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * f + f) +
             (f * d + d);
    case layer_kind::head:
      return 2 * d + v * d; // final LayerNorm + LM head (no bias)
  }
  return 0;
}

std::int64_t model_parameters(const gpt_config& cfg) {
  std::int64_t n = 0;
  for (int l = 0; l < cfg.num_layers(); ++l)
    n += layer_parameters(cfg, l);
  return n;
}

layer_work compute_layer_work(const gpt_config& cfg, int layer, int micro_batch,
                              dtype dt) {
  const double b = micro_batch, t = cfg.seq_len, d = cfg.d_model, f = cfg.d_ff,
               v = cfg.vocab_size, h = cfg.n_head;
  const double n = b * t; // tokens
  const double e = dtype_bytes(dt);
  layer_work w;
  w.kind = kind_of_layer(cfg, layer);
  w.rows = n;
  w.parameters = layer_parameters(cfg, layer);
  const double weight_bytes = static_cast<double>(w.parameters) * e;
  switch (w.kind) {
    case layer_kind::embedding:
      // A gather: no dense FLOPs; rows of both tables read, output written.
      w.forward_flops = n * d; // the token + position add
      w.backward_flops = 2 * n * d;
      // No input to differentiate: the whole backward is the tables'
      // gradients.
      w.weight_gradient_flops = w.backward_flops;
      w.forward_bytes = 3 * n * d * e;
      w.backward_bytes = 4 * n * d * e;
      break;
    case layer_kind::block: {
      const bool llama = cfg.family == model_family::llama;
      // llama: q and o are d x d, k and v d x kv; three MLP matrices.
      const double kv = static_cast<double>(cfg.kv_heads()) * cfg.head_dim();
      double gemm = llama ? 2 * n * (2 * d * d + 2 * d * kv + 3 * d * f)
                          : 2 * n * (4 * d * d + 2 * d * f);
      double attention = 4 * b * t * t * d;
      w.forward_flops = gemm + attention;
      w.backward_flops = 2 * w.forward_flops;
      // Every GEMM's weight gradient costs its forward again; attention's
      // products have no weights.
      w.weight_gradient_flops = gemm;
      // Weights once; activations: norms, q/k/v, attention output,
      // residuals and the MLP's hidden layers, plus the score matrices.
      double act =
        (llama ? n * (8 * d + 2 * kv + 4 * f) : n * (12 * d + 3 * f)) * e +
        2 * b * h * t * t * e;
      w.forward_bytes = weight_bytes + act;
      w.backward_bytes = 2 * weight_bytes + 2 * act;
      break;
    }
    case layer_kind::head:
      w.forward_flops = 2 * n * d * v + 5 * n * v; // GEMM + softmax/loss
      w.backward_flops = 4 * n * d * v + 3 * n * v;
      w.weight_gradient_flops = 2 * n * d * v;
      w.forward_bytes = weight_bytes + (3 * n * d + 3 * n * v) * e;
      w.backward_bytes = 2 * weight_bytes + (4 * n * d + 3 * n * v) * e;
      break;
  }
  return w;
}

layer_work attention_core_work(const gpt_config& cfg, int micro_batch,
                               dtype dt) {
  const double b = micro_batch, t = cfg.seq_len, d = cfg.d_model,
               h = cfg.n_head, e = dtype_bytes(dt);
  layer_work w;
  w.kind = layer_kind::block;
  w.rows = b * t;
  w.forward_flops = 4 * b * t * t * d; // q k^T and p v
  // q, k, v read, the output written, the scores written and read.
  w.forward_bytes = (4 * b * t * d + 2 * b * h * t * t) * e;
  return w;
}

double weight_gradient_share(const layer_work& w) noexcept {
  return w.backward_flops > 0 ? w.weight_gradient_flops / w.backward_flops : 0;
}

double training_flops(const gpt_config& cfg, double tokens) {
  double total = 0;
  for (int l = 0; l < cfg.num_layers(); ++l) {
    auto w = compute_layer_work(cfg, l, 1, dtype::fp32);
    total += (w.forward_flops + w.backward_flops) / cfg.seq_len;
  }
  return total * tokens;
}

} // namespace h2
