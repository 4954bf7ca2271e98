#include "h2/model/layers.hpp"

#include "h2/core/error.hpp"
#include "h2/model/ops.hpp"
#include "h2/model/recompute.hpp"
#include "layer_parts.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

#include <cmath>

namespace h2::model {

std::int64_t layer::parameter_count() const {
  std::int64_t n = 0;
  for (auto& p : params_)
    n += p.value.numel();
  return n;
}

at::Tensor& layer::add(std::string name, at::Tensor value, bool decay) {
  value.set_requires_grad(true);
  parameter& p = params_.emplace_back();
  p.name = std::move(name);
  p.value = std::move(value);
  p.decay = decay;
  return p.value;
}

namespace detail {

namespace {

/// SplitMix64: a well-mixed 64-bit seed from (seed, layer).
std::uint64_t layer_seed(std::uint64_t seed, int index) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

} // namespace

initializer::initializer(initial_weights seed, int index, c10::Device device)
    : gen_(
        at::make_generator<at::CPUGeneratorImpl>(layer_seed(seed.seed, index))),
      device_(device),
      values_(std::move(seed.values)) {
  H2_ENFORCE(!values_.defined() ||
               (values_.scalar_type() == at::kFloat && values_.dim() == 1 &&
                values_.is_contiguous()),
             "layer ", index, ": given values are not a flat fp32 tensor");
}

at::Tensor initializer::given(at::IntArrayRef shape) {
  std::int64_t n = 1;
  for (auto s : shape)
    n *= s;
  H2_ENFORCE(taken_ + n <= values_.numel(), "the given values end after ",
             values_.numel(), " of them");
  // Not a view: a tensor of its own over the same storage, a leaf that can
  // require grad.
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;)
    strides[i - 1] = strides[i] * shape[i];
  auto t = at::empty({0}, values_.options());
  t.set_(values_.storage(), values_.storage_offset() + taken_, shape, strides);
  taken_ += n;
  return t;
}

at::Tensor initializer::normal(at::IntArrayRef shape, double std) {
  if (values_.defined())
    return given(shape);
  auto t = at::empty(shape, at::kFloat);
  t.normal_(0.0, std, gen_);
  return t.to(device_);
}

at::Tensor initializer::zeros(at::IntArrayRef shape) {
  if (values_.defined())
    return given(shape);
  return at::zeros(shape, at::TensorOptions(at::kFloat).device(device_));
}

at::Tensor initializer::ones(at::IntArrayRef shape) {
  if (values_.defined())
    return given(shape);
  return at::ones(shape, at::TensorOptions(at::kFloat).device(device_));
}

at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& mask,
                          bool recompute) {
  if (!recompute)
    return ops::attention(q, k, v, mask);
  return recomputed(
    [mask](const std::vector<at::Tensor>& x) {
      return ops::attention(x[0], x[1], x[2], mask);
    },
    {q, k, v});
}

at::Tensor& head_base::add_lm_head(const gpt_config& cfg, initializer& init,
                                   initial_weights seed, c10::Device device) {
  const std::vector<std::int64_t> shape{cfg.vocab_size, cfg.d_model};
  if (!cfg.tie_embeddings)
    return add("head.lm_head.weight", init.normal(shape, init_std), true);
  // Given values hold the copy too.
  auto value = seed.values.defined()
                 ? init.normal(shape, init_std)
                 : initializer(seed, 0, device).normal(shape, init_std);
  auto& w = add("head.lm_head.weight", std::move(value), true);
  parameters().back().tied = true;
  return w;
}

at::Tensor head_base::forward(const at::Tensor& x, const micro_batch& mb) {
  H2_ENFORCE(mb.targets.defined(), "head needs targets");
  auto loss = ops::cross_entropy_sum(logits(x).reshape({-1, vocab_}),
                                     mb.targets.reshape({-1}));
  return loss * mb.loss_scale;
}

} // namespace detail

namespace {

using detail::init_std;
using detail::initializer;

class embedding_layer final : public layer {
public:
  embedding_layer(const gpt_config& cfg, int index, initial_weights seed,
                  c10::Device device)
      : layer(index, layer_kind::embedding) {
    initializer init(seed, index, device);
    wte_ = add("embedding.wte",
               init.normal({cfg.vocab_size, cfg.d_model}, init_std), true);
    wpe_ = add("embedding.wpe",
               init.normal({cfg.seq_len, cfg.d_model}, init_std), true);
  }

  at::Tensor forward(const at::Tensor&, const micro_batch& mb) override {
    return ops::embedding(wte_, wpe_, mb.tokens);
  }

private:
  at::Tensor wte_, wpe_;
};

class block_layer final : public layer {
public:
  block_layer(const gpt_config& cfg, int index, initial_weights seed,
              c10::Device device)
      : layer(index, layer_kind::block),
        n_head_(cfg.n_head),
        d_model_(cfg.d_model),
        eps_(cfg.norm_eps) {
    initializer init(seed, index, device);
    const std::int64_t d = cfg.d_model, f = cfg.d_ff;
    const double proj_std = init_std / std::sqrt(2.0 * cfg.n_layer);
    std::string p = "block" + std::to_string(index) + ".";
    ln1_w_ = add(p + "ln1.weight", init.ones({d}), false);
    ln1_b_ = add(p + "ln1.bias", init.zeros({d}), false);
    qkv_w_ =
      add(p + "attn.qkv.weight", init.normal({3 * d, d}, init_std), true);
    qkv_b_ = add(p + "attn.qkv.bias", init.zeros({3 * d}), false);
    proj_w_ = add(p + "attn.proj.weight", init.normal({d, d}, proj_std), true);
    proj_b_ = add(p + "attn.proj.bias", init.zeros({d}), false);
    ln2_w_ = add(p + "ln2.weight", init.ones({d}), false);
    ln2_b_ = add(p + "ln2.bias", init.zeros({d}), false);
    fc1_w_ = add(p + "mlp.fc1.weight", init.normal({f, d}, init_std), true);
    fc1_b_ = add(p + "mlp.fc1.bias", init.zeros({f}), false);
    fc2_w_ = add(p + "mlp.fc2.weight", init.normal({d, f}, proj_std), true);
    fc2_b_ = add(p + "mlp.fc2.bias", init.zeros({d}), false);
  }

  at::Tensor forward(const at::Tensor& x, const micro_batch&) override {
    auto h = x + attention(ops::layer_norm(x, ln1_w_, ln1_b_, eps_));
    auto m = ops::layer_norm(h, ln2_w_, ln2_b_, eps_);
    m = ops::linear(ops::gelu(ops::linear(m, fc1_w_, fc1_b_)), fc2_w_, fc2_b_);
    return h + m;
  }

private:
  at::Tensor attention(const at::Tensor& x) {
    const auto b = x.size(0), t = x.size(1);
    const std::int64_t hd = d_model_ / n_head_;
    // [B, T, 3d] -> 3 x [B, H, T, hd]
    auto qkv = ops::linear(x, qkv_w_, qkv_b_)
                 .view({b, t, 3, n_head_, hd})
                 .permute({2, 0, 3, 1, 4});
    auto y = detail::attention_core(
      qkv.select(0, 0), qkv.select(0, 1), qkv.select(0, 2),
      causal_mask(t, x.device()), attention_recompute());
    y = y.transpose(1, 2).reshape({b, t, d_model_});
    return ops::linear(y, proj_w_, proj_b_);
  }

  const at::Tensor& causal_mask(std::int64_t t, c10::Device device) {
    if (!mask_.defined() || mask_.size(0) != t || mask_.device() != device)
      mask_ = ops::causal_mask(t, device);
    return mask_;
  }

  std::int64_t n_head_, d_model_;
  double eps_;
  at::Tensor ln1_w_, ln1_b_, qkv_w_, qkv_b_, proj_w_, proj_b_;
  at::Tensor ln2_w_, ln2_b_, fc1_w_, fc1_b_, fc2_w_, fc2_b_;
  at::Tensor mask_;
};

class head_layer final : public detail::head_base {
public:
  head_layer(const gpt_config& cfg, int index, initial_weights seed,
             c10::Device device)
      : head_base(index, cfg.vocab_size), eps_(cfg.norm_eps) {
    initializer init(seed, index, device);
    ln_w_ = add("head.ln_f.weight", init.ones({cfg.d_model}), false);
    ln_b_ = add("head.ln_f.bias", init.zeros({cfg.d_model}), false);
    lm_w_ = add_lm_head(cfg, init, seed, device);
  }

  at::Tensor logits(const at::Tensor& x) const override {
    return ops::linear(ops::layer_norm(x, ln_w_, ln_b_, eps_), lm_w_,
                       at::Tensor());
  }

private:
  double eps_;
  at::Tensor ln_w_, ln_b_, lm_w_;
};

} // namespace

at::Tensor head_logits(const layer& head, const at::Tensor& input) {
  const auto* h = dynamic_cast<const detail::head_base*>(&head);
  H2_ENFORCE(h != nullptr, "head_logits of layer ", head.index(), ", a ",
             to_string(head.kind()));
  return h->logits(input);
}

std::unique_ptr<layer> make_layer(const gpt_config& cfg, int index,
                                  initial_weights seed, c10::Device device) {
  if (cfg.family == model_family::llama)
    return detail::make_llama_layer(cfg, index, seed, device);
  return detail::make_family_layer<embedding_layer, block_layer, head_layer>(
    cfg, index, seed, device);
}

} // namespace h2::model
