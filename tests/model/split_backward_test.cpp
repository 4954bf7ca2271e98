// The split backward (model/split_backward.hpp): B then W gives bitwise the
// gradients of the fused backward, B leaves the weights alone, W the input.
#include "h2/model/split_backward.hpp"
#include "h2/model/stage.hpp"

#include "h2/core/error.hpp"
#include "stage_fixtures.hpp"
#include "test_jobs.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace h2::model {
namespace {

using fixtures::batch;
using fixtures::same_bits;

gpt_config shape() {
  return test::gpt_shape(17, 8, 16, 2, 3, 32);
}

/// One stage [first, end) run twice on two micro-batches: fused, then split
/// (both B before both W, as zb-h1 runs them); every gradient compared.
void expect_split_equals_fused(int first, int end) {
  SCOPED_TRACE(testing::Message() << "layers [" << first << ", " << end << ")");
  at::set_num_threads(1);
  const auto c = shape();
  stage fused(c, first, end, 3), split(c, first, end, 3);
  const bool has_input = first > 0;
  const bool has_head = end == c.num_layers();
  auto input_of = [&](int seed) {
    return has_input ? at::randn({2, c.seq_len, c.d_model},
                                 at::TensorOptions().dtype(at::kFloat))
                         .mul_(0.5 + seed)
                     : at::Tensor();
  };
  auto grad_of = [&](const at::Tensor& out) {
    return has_head ? at::Tensor() : at::full_like(out, 0.01).cumsum(-1);
  };
  at::manual_seed(11);
  std::vector<at::Tensor> inputs{input_of(0), input_of(1)};
  std::vector<at::Tensor> fused_input_grads, split_input_grads;
  for (int mb = 0; mb < 2; ++mb) {
    auto in =
      has_input ? inputs[mb].clone().requires_grad_(true) : at::Tensor();
    auto out = fused.forward(in, batch(c, mb));
    out.backward(grad_of(out));
    fused_input_grads.push_back(has_input ? in.grad() : at::Tensor());
  }
  std::vector<deferred_weight_gradients> pending;
  for (int mb = 0; mb < 2; ++mb) {
    auto in =
      has_input ? inputs[mb].clone().requires_grad_(true) : at::Tensor();
    auto out = split.forward(in, batch(c, mb));
    std::vector<at::Tensor> params;
    for (parameter* p : split.parameters())
      params.push_back(p->value);
    auto [input_grad, w] =
      deferred_weight_gradients::backward_input(out, grad_of(out), in, params);
    split_input_grads.push_back(input_grad);
    EXPECT_TRUE(w.pending());
    if (has_input) {
      EXPECT_FALSE(in.grad().defined()) << "B accumulated into the input";
    }
    pending.push_back(std::move(w));
  }
  for (parameter* p : split.parameters())
    EXPECT_FALSE(p->value.grad().defined()) << p->name << ": B touched it";
  for (auto& w : pending) {
    w.run();
    EXPECT_FALSE(w.pending());
    EXPECT_THROW(w.run(), internal_error);
  }
  for (int mb = 0; mb < 2; ++mb)
    EXPECT_TRUE(same_bits(fused_input_grads[mb], split_input_grads[mb]))
      << "input gradient of micro-batch " << mb;
  auto a = fused.parameters(), b = split.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i]->value.grad().defined()) << a[i]->name;
    EXPECT_TRUE(same_bits(a[i]->value.grad(), b[i]->value.grad()))
      << a[i]->name << " differs";
  }
}

TEST(model_split_backward, every_stage_shape_is_bitwise_the_fused_backward) {
  const int layers = shape().num_layers(); // embedding, 3 blocks, head
  expect_split_equals_fused(0, 1);         // the embedding: W is everything
  expect_split_equals_fused(1, 2);         // one block
  expect_split_equals_fused(1, 4);         // blocks
  expect_split_equals_fused(layers - 1, layers); // the head and the loss
  expect_split_equals_fused(2, layers);          // blocks and the head
  expect_split_equals_fused(0, layers);          // the whole model
}

} // namespace
} // namespace h2::model
