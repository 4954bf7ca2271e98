#include "h2/model/layers.hpp"

#include "h2/core/error.hpp"
#include "h2/model/ops.hpp"
#include "h2/model/recompute.hpp"
#include "layer_parts.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
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

at::Tensor slot(const at::Tensor& flat, std::int64_t offset,
                at::IntArrayRef shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;)
    strides[i - 1] = strides[i] * shape[i];
  auto t = at::empty({0}, flat.options().requires_grad(false));
  t.set_(flat.storage(), flat.storage_offset() + offset, shape, strides);
  return t;
}

initializer::initializer(const gpt_config& cfg, initial_weights seed, int index,
                         c10::Device device)
    : seed_(seed.seed),
      gen_(
        at::make_generator<at::CPUGeneratorImpl>(layer_seed(seed.seed, index))),
      values_(std::move(seed.values)),
      given_(values_.defined()) {
  const auto count = layer_parameters(cfg, index);
  if (!given_)
    values_ = at::empty({count}, at::TensorOptions(at::kFloat).device(device));
  H2_ENFORCE(values_.scalar_type() == at::kFloat && values_.dim() == 1 &&
               values_.numel() == count && values_.is_contiguous() &&
               values_.device() == device,
             "layer ", index, ": given values are not ", count,
             " contiguous fp32 values on ", device);
}

at::Tensor initializer::next(at::IntArrayRef shape) {
  std::int64_t n = 1;
  for (auto s : shape)
    n *= s;
  H2_ENFORCE(taken_ + n <= values_.numel(), "the layer's values end after ",
             values_.numel(), " of them");
  auto t = slot(values_, taken_, shape);
  taken_ += n;
  return t;
}

at::Tensor initializer::draw(at::IntArrayRef shape, double std,
                             at::Generator& gen) {
  auto t = next(shape);
  if (given_)
    return t;
  // normal_ fills a contiguous fp32 tensor from the generator by its size
  // alone: in place, a slice gets the bits a tensor of its own would.
  if (t.is_cpu()) {
    t.normal_(0.0, std, gen);
    return t;
  }
  auto host = at::empty(shape, at::kFloat);
  host.normal_(0.0, std, gen);
  t.copy_(host);
  return t;
}

at::Tensor initializer::normal(at::IntArrayRef shape, double std) {
  return draw(shape, std, gen_);
}

at::Tensor initializer::normal_of(int index, at::IntArrayRef shape,
                                  double std) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(layer_seed(seed_, index));
  return draw(shape, std, gen);
}

at::Tensor initializer::zeros(at::IntArrayRef shape) {
  auto t = next(shape);
  return given_ ? t : t.zero_();
}

at::Tensor initializer::ones(at::IntArrayRef shape) {
  auto t = next(shape);
  return given_ ? t : t.fill_(1.0);
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

at::Tensor& head_base::add_lm_head(const gpt_config& cfg, initializer& init) {
  const std::vector<std::int64_t> shape{cfg.vocab_size, cfg.d_model};
  if (!cfg.tie_embeddings)
    return add("head.lm_head.weight", init.normal(shape, init_std), true);
  auto& w =
    add("head.lm_head.weight", init.normal_of(0, shape, init_std), true);
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
    initializer init(cfg, seed, index, device);
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
    initializer init(cfg, seed, index, device);
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
    initializer init(cfg, seed, index, device);
    ln_w_ = add("head.ln_f.weight", init.ones({cfg.d_model}), false);
    ln_b_ = add("head.ln_f.bias", init.zeros({cfg.d_model}), false);
    lm_w_ = add_lm_head(cfg, init);
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
  auto l =
    cfg.family == model_family::llama
      ? detail::make_llama_layer(cfg, index, seed, device)
      : detail::make_family_layer<embedding_layer, block_layer, head_layer>(
          cfg, index, seed, device);
  H2_ENFORCE(l->parameter_count() == layer_parameters(cfg, index), "layer ",
             index, " has ", l->parameter_count(),
             " parameters, its size says ", layer_parameters(cfg, index));
  return l;
}

namespace {

/// `parts` as one flat fp32 tensor: the buffer they are consecutive
/// slices of, else a packed copy.
at::Tensor flat_of(const std::vector<const at::Tensor*>& parts) {
  H2_ENFORCE(!parts.empty(), "no tensors to flatten");
  const auto& first = *parts.front();
  bool in_place = true;
  std::int64_t total = 0;
  for (const auto* t : parts) {
    in_place = in_place && t->scalar_type() == at::kFloat &&
               t->is_contiguous() &&
               t->storage().is_alias_of(first.storage()) &&
               t->storage_offset() == first.storage_offset() + total;
    total += t->numel();
  }
  if (in_place)
    return detail::slot(first, 0, {total});
  std::vector<at::Tensor> flat;
  for (const auto* t : parts)
    flat.push_back(t->detach().to(at::kFloat).reshape({-1}));
  return at::cat(flat);
}

} // namespace

at::Tensor flat_values(const layer& l) {
  std::vector<const at::Tensor*> parts;
  for (const auto& p : l.parameters())
    parts.push_back(&p.value);
  return flat_of(parts);
}

at::Tensor flat_moments(const layer& l) {
  std::vector<const at::Tensor*> parts;
  for (const auto& p : l.parameters()) {
    H2_ENFORCE(p.shard_length < 0, "layer ", l.index(), ", ", p.name,
               ": sharded moments are not the layer's");
    H2_ENFORCE(p.exp_avg.defined() ==
                   l.parameters().front().exp_avg.defined() &&
                 p.exp_avg.defined() == p.exp_avg_sq.defined(),
               "layer ", l.index(), ", ", p.name,
               ": AdamW moments for some parameters only");
    if (p.exp_avg.defined()) {
      parts.push_back(&p.exp_avg);
      parts.push_back(&p.exp_avg_sq);
    }
  }
  return parts.empty() ? at::Tensor() : flat_of(parts);
}

} // namespace h2::model
