// The llama family's layers (docs/architecture.md, "Model"): token
// embedding; pre-RMSNorm blocks of grouped-query attention with rotary
// positions and a SwiGLU MLP, without biases; final RMSNorm and LM head.
// The math follows Hugging Face's LlamaForCausalLM (docs/export.md), so an
// export loads there unchanged.
#include "h2/core/error.hpp"
#include "h2/model/ops.hpp"

#include "layer_parts.hpp"

#include <ATen/TensorOperators.h>

#include <cmath>

namespace h2::model::detail {

namespace {

class llama_embedding final : public layer {
public:
  llama_embedding(const gpt_config& cfg, int index, initial_weights seed,
                  c10::Device device)
      : layer(index, layer_kind::embedding) {
    initializer init(cfg, seed, index, device);
    wte_ = add("embedding.wte",
               init.normal({cfg.vocab_size, cfg.d_model}, init_std), true);
  }

  at::Tensor forward(const at::Tensor&, const micro_batch& mb) override {
    return ops::token_embedding(wte_, mb.tokens);
  }

private:
  at::Tensor wte_;
};

class llama_block final : public layer {
public:
  llama_block(const gpt_config& cfg, int index, initial_weights seed,
              c10::Device device)
      : layer(index, layer_kind::block),
        n_head_(cfg.n_head),
        n_kv_head_(cfg.kv_heads()),
        head_dim_(cfg.head_dim()),
        d_model_(cfg.d_model),
        eps_(cfg.norm_eps),
        rope_theta_(cfg.rope_theta) {
    initializer init(cfg, seed, index, device);
    const std::int64_t d = cfg.d_model, f = cfg.d_ff,
                       kv = n_kv_head_ * head_dim_;
    const double proj_std = init_std / std::sqrt(2.0 * cfg.n_layer);
    std::string p = "block" + std::to_string(index) + ".";
    attn_norm_ = add(p + "attn_norm.weight", init.ones({d}), false);
    q_ = add(p + "attn.q.weight", init.normal({d, d}, init_std), true);
    k_ = add(p + "attn.k.weight", init.normal({kv, d}, init_std), true);
    v_ = add(p + "attn.v.weight", init.normal({kv, d}, init_std), true);
    o_ = add(p + "attn.o.weight", init.normal({d, d}, proj_std), true);
    mlp_norm_ = add(p + "mlp_norm.weight", init.ones({d}), false);
    gate_ = add(p + "mlp.gate.weight", init.normal({f, d}, init_std), true);
    up_ = add(p + "mlp.up.weight", init.normal({f, d}, init_std), true);
    down_ = add(p + "mlp.down.weight", init.normal({d, f}, proj_std), true);
  }

  at::Tensor forward(const at::Tensor& x, const micro_batch&) override {
    auto h = x + attention(ops::rms_norm(x, attn_norm_, eps_));
    auto m = ops::rms_norm(h, mlp_norm_, eps_);
    m = ops::linear(
      ops::swiglu(ops::linear(m, gate_, {}), ops::linear(m, up_, {})), down_,
      {});
    return h + m;
  }

private:
  /// [B, T, d] -> [B, heads, T, head_dim]
  at::Tensor split_heads(const at::Tensor& x, std::int64_t heads) const {
    return x.view({x.size(0), x.size(1), heads, head_dim_}).transpose(1, 2);
  }

  at::Tensor attention(const at::Tensor& x) {
    const auto b = x.size(0), t = x.size(1);
    refresh_tables(t, x.device());
    auto q =
      ops::rope(split_heads(ops::linear(x, q_, {}), n_head_), cos_, sin_);
    auto k =
      ops::rope(split_heads(ops::linear(x, k_, {}), n_kv_head_), cos_, sin_);
    auto v = split_heads(ops::linear(x, v_, {}), n_kv_head_);
    auto y = attention_core(q, k, v, mask_, attention_recompute());
    y = y.transpose(1, 2).reshape({b, t, d_model_});
    return ops::linear(y, o_, {});
  }

  /// The causal mask and the rotary tables for sequences of `t` tokens.
  void refresh_tables(std::int64_t t, c10::Device device) {
    if (mask_.defined() && mask_.size(0) == t && mask_.device() == device)
      return;
    mask_ = ops::causal_mask(t, device);
    std::tie(cos_, sin_) = ops::rope_tables(t, head_dim_, rope_theta_, device);
  }

  std::int64_t n_head_, n_kv_head_, head_dim_, d_model_;
  double eps_, rope_theta_;
  at::Tensor attn_norm_, q_, k_, v_, o_, mlp_norm_, gate_, up_, down_;
  at::Tensor mask_, cos_, sin_;
};

class llama_head final : public head_base {
public:
  llama_head(const gpt_config& cfg, int index, initial_weights seed,
             c10::Device device)
      : head_base(index, cfg.vocab_size), eps_(cfg.norm_eps) {
    initializer init(cfg, seed, index, device);
    norm_ = add("head.norm.weight", init.ones({cfg.d_model}), false);
    lm_w_ = add_lm_head(cfg, init);
  }

  at::Tensor logits(const at::Tensor& x) const override {
    return ops::linear(ops::rms_norm(x, norm_, eps_), lm_w_, at::Tensor());
  }

private:
  double eps_;
  at::Tensor norm_, lm_w_;
};

} // namespace

std::unique_ptr<layer> make_llama_layer(const gpt_config& cfg, int index,
                                        initial_weights seed,
                                        c10::Device device) {
  return detail::make_family_layer<llama_embedding, llama_block, llama_head>(
    cfg, index, seed, device);
}

} // namespace h2::model::detail
