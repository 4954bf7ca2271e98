// What the stage-level model tests share: a deterministic micro-batch and
// a bitwise comparison of tensors.
#pragma once

#include "h2/model/layers.hpp"

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>

namespace h2::model::fixtures {

/// Two sequences of `c.seq_len` tokens and targets drawn from `seed`, loss
/// scale 1/4.
inline micro_batch batch(const gpt_config& c, int seed) {
  micro_batch mb;
  mb.tokens = at::empty({2, c.seq_len}, at::kLong);
  mb.targets = at::empty({2, c.seq_len}, at::kLong);
  for (int i = 0; i < 2 * c.seq_len; ++i) {
    mb.tokens.data_ptr<std::int64_t>()[i] = (i * 7 + seed) % c.vocab_size;
    mb.targets.data_ptr<std::int64_t>()[i] = (i * 5 + seed) % c.vocab_size;
  }
  mb.loss_scale = 0.25;
  return mb;
}

/// Both undefined, or the same shape and bits (compared as fp32).
inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined())
    return a.defined() == b.defined();
  auto x = a.contiguous().to(at::kFloat), y = b.contiguous().to(at::kFloat);
  return x.sizes() == y.sizes() &&
         std::memcmp(x.data_ptr<float>(), y.data_ptr<float>(),
                     static_cast<std::size_t>(x.numel()) * sizeof(float)) == 0;
}

} // namespace h2::model::fixtures
