// Text generation from a checkpoint's model (docs/export.md, "Generating"):
// what h2-generate does with token ids, on the host CPU in fp32.
#pragma once

#include "h2/runtime/export.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace h2::runtime {

struct sampling {
  double temperature = 0.8; ///< 0: greedy (the most likely token)
  int top_k = 40;           ///< sample among the k likeliest; 0: all
  std::uint64_t seed = 0;   ///< the same seed, the same continuation
};

/// The index of the token drawn from `logits` as `s` says, with uniform
/// number `u` in [0, 1): greedy takes the largest logit (the first of
/// equals); otherwise softmax(logits / temperature) over the top_k largest,
/// inverted at u.
std::int32_t sample_token(std::span<const float> logits, const sampling& s,
                          double u);

/// `count` tokens continuing `prompt` (ids in [0, vocab_size), at least
/// one), each drawn from the model's logits at the last position given the
/// last seq_len tokens so far. Reproducible: the i-th draw uses a uniform
/// number from (seed, i).
std::vector<std::int32_t> generate(const checkpoint_model& m,
                                   std::span<const std::int32_t> prompt,
                                   int count, const sampling& s);

} // namespace h2::runtime
