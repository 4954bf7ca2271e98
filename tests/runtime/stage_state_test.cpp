// A layer's state to and from host memory (runtime/stage_state.hpp): what a
// checkpoint saves and a resume restores, and the state it refuses.
#include "h2/runtime/safetensors.hpp"
#include "h2/runtime/stage_state.hpp"
#include "layer_fixtures.hpp"

#include <ATen/ops/equal.h>

#include <gtest/gtest.h>

#include <algorithm>

namespace h2::test {
namespace {

TEST(runtime_stage_state, a_restored_layer_has_the_saved_state) {
  auto job = three_chips_of(small_model_toml);
  auto chip = chip_of(*job, 0);
  for (int index : {0, 2, 5}) {
    SCOPED_TRACE(index);
    auto saved = updated_layer(*job, index, *chip);
    devices::thread_binding bind(*chip);
    const auto state = runtime::snapshot_layer(*chip, *saved);
    auto fresh = model::make_layer(job->model, index, 11, chip->torch_device());
    runtime::restore_layer(*chip, *fresh, state);
    for (std::size_t i = 0; i < saved->parameters().size(); ++i) {
      const auto& want = saved->parameters()[i];
      const auto& got = fresh->parameters()[i];
      EXPECT_TRUE(at::equal(got.value, want.value)) << want.name;
      EXPECT_TRUE(at::equal(got.exp_avg, want.exp_avg)) << want.name;
      EXPECT_TRUE(at::equal(got.exp_avg_sq, want.exp_avg_sq)) << want.name;
    }
    // Before the first update a layer has no moments: restoring such a
    // state drops the layer's.
    auto before = model::make_layer(job->model, index, 3, chip->torch_device());
    runtime::restore_layer(*chip, *fresh,
                           runtime::snapshot_layer(*chip, *before));
    for (const auto& p : fresh->parameters())
      EXPECT_FALSE(p.exp_avg.defined()) << p.name;
  }
}

// Moments for some of a layer's parameters and not others would restart
// the others' moments from zero: refused, naming the layer and parameter.
TEST(runtime_stage_state, moments_for_part_of_a_layer_are_refused) {
  auto job = three_chips_of(small_model_toml);
  auto chip = chip_of(*job, 0);
  auto saved = updated_layer(*job, 2, *chip);
  devices::thread_binding bind(*chip);
  const auto state = runtime::snapshot_layer(*chip, *saved);
  const auto& last = saved->parameters().back().name;
  // One moment of two, the other, both.
  for (const std::vector<std::string>& dropped :
       {std::vector<std::string>{".exp_avg"},
        {".exp_avg_sq"},
        {".exp_avg", ".exp_avg_sq"}}) {
    SCOPED_TRACE(dropped.size() == 2 ? "both" : dropped.front());
    auto partial = state;
    std::erase_if(partial.tensors, [&](const runtime::state_tensor& t) {
      return std::ranges::any_of(
        dropped, [&](const std::string& d) { return t.name == last + d; });
    });
    ASSERT_EQ(partial.tensors.size(), state.tensors.size() - dropped.size());
    auto target = model::make_layer(job->model, 2, 11, chip->torch_device());
    try {
      runtime::restore_layer(*chip, *target, partial);
      ADD_FAILURE() << "restored moments for part of the layer";
    } catch (const runtime::checkpoint_error& e) {
      EXPECT_EQ(e.kind(), runtime::checkpoint_errc::mismatch);
      const std::string what = e.what();
      EXPECT_NE(what.find("layer 2: " + last), std::string::npos) << what;
    }
  }
}

} // namespace
} // namespace h2::test
