// What the layers of both families (layers.cpp: gpt2, llama.cpp: llama)
// share inside model/: their initial weights and the head's logits.
#pragma once

#include "h2/core/error.hpp"
#include "h2/model/layers.hpp"

#include <ATen/core/Generator.h>

namespace h2::model::detail {

/// A tensor of `shape` of its own over `flat`'s storage from element
/// `offset` on (contiguous): a leaf that can require grad, not a view.
at::Tensor slot(const at::Tensor& flat, std::int64_t offset,
                at::IntArrayRef shape);

/// Hands out a layer's parameters as the next slices of one flat fp32
/// buffer of `cfg`'s layer `index` (layer_parameters()): the given one
/// (initial_weights::over()), left as it is, or one it allocates on
/// `device` and fills as asked, drawing in a fixed order from the layer's
/// own generator (seeded from (seed, index)) on the host: the same bits
/// whatever the device.
class initializer {
public:
  initializer(const gpt_config& cfg, initial_weights seed, int index,
              c10::Device device);

  at::Tensor normal(at::IntArrayRef shape, double std);
  /// normal() drawn from global layer `index`'s generator instead (a tied
  /// head's copy of the embedding's first draw).
  at::Tensor normal_of(int index, at::IntArrayRef shape, double std);
  at::Tensor zeros(at::IntArrayRef shape);
  at::Tensor ones(at::IntArrayRef shape);

private:
  /// The next slice of `shape`.
  at::Tensor next(at::IntArrayRef shape);
  at::Tensor draw(at::IntArrayRef shape, double std, at::Generator& gen);

  std::uint64_t seed_;
  at::Generator gen_;
  at::Tensor values_;
  bool given_;
  std::int64_t taken_ = 0;
};

/// GPT-2's initialisation, which the llama layers share: N(0, 0.02)
/// weights, residual projections scaled by 1/sqrt(2 n_layer), zero biases,
/// unit norm gains.
inline constexpr double init_std = 0.02;

/// A head: final norm, LM head, loss.
class head_base : public layer {
public:
  /// [B, T, d] -> [B, T, vocab] in the input's (or autocast's) dtype.
  virtual at::Tensor logits(const at::Tensor& x) const = 0;

  /// The summed token cross-entropy of logits(x), times mb.loss_scale.
  at::Tensor forward(const at::Tensor& x, const micro_batch& mb) final;

protected:
  head_base(int index, std::int64_t vocab)
      : layer(index, layer_kind::head), vocab_(vocab) {}

  /// Adds "head.lm_head.weight" [vocab, d_model], drawn by `init`; or, tied
  /// (cfg.tie_embeddings), the embedding's own first draw (layer 0 draws
  /// its token table first in both families), marked tied.
  at::Tensor& add_lm_head(const gpt_config& cfg, initializer& init);

private:
  std::int64_t vocab_;
};

/// Layer `index` of `cfg` as one family builds it: its embedding, block or
/// head class, each constructed from (cfg, index, seed, device).
template <class Embedding, class Block, class Head>
std::unique_ptr<layer> make_family_layer(const gpt_config& cfg, int index,
                                         initial_weights seed,
                                         c10::Device device) {
  switch (kind_of_layer(cfg, index)) {
    case layer_kind::embedding:
      return std::make_unique<Embedding>(cfg, index, seed, device);
    case layer_kind::block:
      return std::make_unique<Block>(cfg, index, seed, device);
    case layer_kind::head:
      return std::make_unique<Head>(cfg, index, seed, device);
  }
  throw internal_error("unknown layer kind");
}

/// ops::attention, kept for the backward or, with `recompute`, recomputed
/// in it (model/recompute.hpp): then only q, k and v are kept.
at::Tensor attention_core(const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& mask,
                          bool recompute);

/// llama.cpp's layers.
std::unique_ptr<layer> make_llama_layer(const gpt_config& cfg, int index,
                                        initial_weights seed,
                                        c10::Device device);

} // namespace h2::model::detail
