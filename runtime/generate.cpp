#include "h2/runtime/generate.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace h2::runtime {

namespace {

/// A uniform number in [0, 1) from (seed, i): SplitMix64.
double uniform(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

} // namespace

std::int32_t sample_token(std::span<const float> logits, const sampling& s,
                          double u) {
  H2_ENFORCE(!logits.empty(), "no logits");
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Largest first; equal logits by index, so the draw is deterministic.
  auto larger = [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (s.temperature <= 0)
    return *std::min_element(order.begin(), order.end(), larger);
  const std::size_t k =
    s.top_k > 0 ? std::min<std::size_t>(s.top_k, order.size()) : order.size();
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(k),
                    order.end(), larger);
  std::vector<double> p(k);
  const double top = logits[order[0]];
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i)
    sum += p[i] = std::exp((logits[order[i]] - top) / s.temperature);
  double at = u * sum;
  for (std::size_t i = 0; i < k; ++i) {
    at -= p[i];
    if (at < 0)
      return order[i];
  }
  return order[k - 1];
}

std::vector<std::int32_t> generate(const checkpoint_model& m,
                                   std::span<const std::int32_t> prompt,
                                   int count, const sampling& s) {
  H2_ENFORCE(!prompt.empty(), "an empty prompt");
  const auto t = static_cast<std::size_t>(m.config().seq_len);
  std::vector<std::int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<std::int32_t> out;
  for (int i = 0; i < count; ++i) {
    const auto window = std::span(tokens).last(std::min(t, tokens.size()));
    const auto logits = m.last_logits(window);
    const auto next =
      sample_token(logits, s, uniform(s.seed, static_cast<std::uint64_t>(i)));
    tokens.push_back(next);
    out.push_back(next);
  }
  return out;
}

} // namespace h2::runtime
