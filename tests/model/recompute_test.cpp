// Recomputation inside a stage (model/recompute.hpp): whole blocks and
// attention cores recomputed in the backward give bitwise the gradients of
// the stage that keeps everything, fused or split into B and W, in fp32 and
// under bf16 autocast, for both families.
#include "h2/model/recompute.hpp"
#include "h2/model/split_backward.hpp"
#include "h2/model/stage.hpp"

#include "h2/devices/torch_compat.hpp"
#include "stage_fixtures.hpp"
#include "test_jobs.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

namespace h2::model {
namespace recompute_cases {

using fixtures::batch;
using fixtures::same_bits;

gpt_config shape(model_family family) {
  auto c = test::gpt_shape(17, 8, 16, 2, 3, 32);
  c.family = family;
  return c;
}

/// bf16 autocast on the host for its lifetime, as devices::compute_scope
/// sets it for a bf16 chip.
class bf16_autocast {
public:
  bf16_autocast() {
    at::autocast::increment_nesting();
    devices::compat::set_autocast(c10::kCPU, true, at::kBFloat16);
  }
  ~bf16_autocast() {
    devices::compat::set_autocast(c10::kCPU, false, at::kBFloat16);
    if (at::autocast::decrement_nesting() == 0)
      at::autocast::clear_cache();
  }
};

/// The gradients of two micro-batches through stage [first, end): the input
/// gradients, then every parameter's.
std::vector<at::Tensor> gradients(const gpt_config& c, int first, int end,
                                  const recompute_policy& policy, bool split,
                                  bool bf16) {
  stage s(c, first, end, 3);
  s.set_recompute(policy);
  const bool has_input = first > 0, has_head = end == c.num_layers();
  at::manual_seed(11);
  std::vector<at::Tensor> out;
  std::vector<deferred_weight_gradients> pending;
  for (int mb = 0; mb < 2; ++mb) {
    auto in = has_input ? at::randn({2, c.seq_len, c.d_model})
                            .mul_(0.5 + mb)
                            .requires_grad_(true)
                        : at::Tensor();
    at::Tensor y;
    {
      std::optional<bf16_autocast> autocast;
      if (bf16)
        autocast.emplace();
      y = s.forward(in, batch(c, mb));
    }
    auto g =
      has_head ? at::Tensor() : at::full_like(y, 0.01, at::kFloat).cumsum(-1);
    if (split) {
      std::vector<at::Tensor> params;
      for (parameter* p : s.parameters())
        params.push_back(p->value);
      auto [input_grad, w] =
        deferred_weight_gradients::backward_input(y, g, in, params);
      out.push_back(input_grad);
      pending.push_back(std::move(w));
    } else {
      y.backward(g);
      out.push_back(has_input ? in.grad() : at::Tensor());
    }
  }
  for (auto& w : pending)
    w.run();
  for (parameter* p : s.parameters())
    out.push_back(p->value.grad());
  return out;
}

void expect_bitwise(const gpt_config& c, int first, int end,
                    const recompute_policy& policy) {
  for (bool bf16 : {false, true})
    for (bool split : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << to_string(c.family) << " [" << first << ", " << end
                   << ") " << to_string(policy) << (bf16 ? " bf16" : " fp32")
                   << (split ? " split" : " fused"));
      const auto kept = gradients(c, first, end, {}, false, bf16);
      const auto again = gradients(c, first, end, policy, split, bf16);
      ASSERT_EQ(kept.size(), again.size());
      for (std::size_t i = 0; i < kept.size(); ++i) {
        ASSERT_EQ(kept[i].defined(), again[i].defined()) << "gradient " << i;
        EXPECT_TRUE(same_bits(kept[i], again[i])) << "gradient " << i;
      }
    }
}

TEST(model_recompute, recomputed_blocks_and_attention_are_bitwise_kept_ones) {
  at::set_num_threads(1);
  for (auto family : {model_family::gpt2, model_family::llama}) {
    const auto c = shape(family);
    const int layers = c.num_layers(); // embedding, 3 blocks, head
    expect_bitwise(c, 1, 4, {false, 0, true});
    expect_bitwise(c, 1, 4, {false, 1, false});
    expect_bitwise(c, 1, 4, {false, 3, false});
    expect_bitwise(c, 0, layers, {false, 2, true});
  }
}

TEST(model_recompute, recomputation_keeps_only_the_inputs) {
  // One block recomputed whole: its graph holds one node, which keeps the
  // block's input (and nothing else autograd would save).
  at::set_num_threads(1);
  const auto c = shape(model_family::gpt2);
  stage s(c, 1, 2, 3);
  s.set_recompute({false, 1, false});
  auto in = at::randn({2, c.seq_len, c.d_model}).requires_grad_(true);
  auto y = s.forward(in, batch(c, 0));
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), "h2::RecomputeBackward");
  ASSERT_EQ(y.grad_fn()->next_edges().size(), 1u);
  // Without grad mode it is the plain forward.
  at::NoGradGuard no_grad;
  EXPECT_FALSE(s.forward(in, batch(c, 0)).grad_fn());
}

// A recomputed piece's first forward runs with autocast's cast cache off
// (it keeps nothing, so cached bf16 weight copies would only hold memory
// until the stage's forward ends); its backward's run, and everything after
// it, caches as before, also when the piece throws.
TEST(model_recompute, the_first_run_caches_no_casts) {
  bf16_autocast scope;
  auto w = at::randn({4, 4}).requires_grad_(true);
  auto x = at::randn({2, 4}).requires_grad_(true);
  std::vector<bool> caching;
  auto piece = [&](const std::vector<at::Tensor>& in) {
    caching.push_back(at::autocast::is_autocast_cache_enabled());
    return at::matmul(in[0], w).sum(1);
  };
  auto y = recomputed(piece, {x});
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
  y.sum().backward();
  EXPECT_EQ(caching, (std::vector<bool>{false, true}));
  EXPECT_TRUE(w.grad().defined());
  auto throwing = [](const std::vector<at::Tensor>&) -> at::Tensor {
    throw std::runtime_error("piece failed");
  };
  EXPECT_THROW(recomputed(throwing, {x}), std::runtime_error);
  EXPECT_TRUE(at::autocast::is_autocast_cache_enabled());
}

} // namespace recompute_cases
} // namespace h2::model
