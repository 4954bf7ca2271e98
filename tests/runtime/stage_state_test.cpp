// A layer's state to and from host memory (runtime/stage_state.hpp): what a
// checkpoint saves and a resume restores, and a state it refuses.
#include "h2/runtime/safetensors.hpp"
#include "h2/runtime/stage_state.hpp"
#include "layer_fixtures.hpp"

#include <ATen/ops/equal.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace h2::test {
namespace {

/// Layer 2 of a small GPT updated once on an emulated chip bound to this
/// thread, and its snapshot.
struct saved_layer {
  std::shared_ptr<job_config> job = three_chips_of(small_model_toml);
  std::unique_ptr<devices::device_context> chip = chip_of(*job, 0);
  std::unique_ptr<model::layer> layer = updated_layer(*job, 2, *chip);
  devices::thread_binding bind{*chip};
  runtime::layer_state state = runtime::snapshot_layer(*chip, *layer);
};

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

// A parameter saved with one AdamW moment of two is refused, naming the
// layer and parameter. (A parameter saved with neither, beside others with
// both, is a state the optimizer makes: one that never had a gradient.)
TEST(runtime_stage_state, one_moment_of_two_is_refused) {
  saved_layer on;
  auto& [job, chip, saved, bind, state] = on;
  const auto& first = saved->parameters().front().name;
  for (const char* dropped : {".exp_avg", ".exp_avg_sq"}) {
    SCOPED_TRACE(dropped);
    auto partial = state;
    std::erase_if(partial.tensors, [&](const runtime::state_tensor& t) {
      return t.name == first + dropped;
    });
    ASSERT_EQ(partial.tensors.size(), state.tensors.size() - 1);
    auto target = model::make_layer(job->model, 2, 11, chip->torch_device());
    try {
      runtime::restore_layer(*chip, *target, partial);
      ADD_FAILURE() << "restored one moment of two";
    } catch (const runtime::checkpoint_error& e) {
      EXPECT_EQ(e.kind(), runtime::checkpoint_errc::mismatch);
      const std::string what = e.what();
      EXPECT_NE(what.find("layer 2: " + first + " has one AdamW moment of two"),
                std::string::npos)
        << what;
    }
  }
}

// A parameter saved without moments beside others with them (one that
// never had a gradient) comes back without moments, wherever it stands in
// the layer, and the others with theirs.
TEST(runtime_stage_state, a_parameter_saved_without_moments_has_none) {
  saved_layer on;
  auto& [job, chip, saved, bind, state] = on;
  const auto& params = saved->parameters();
  for (std::size_t bare : {std::size_t{0}, params.size() - 1}) {
    SCOPED_TRACE(params[bare].name);
    auto partial = state;
    std::erase_if(partial.tensors, [&](const runtime::state_tensor& t) {
      return t.name == params[bare].name + ".exp_avg" ||
             t.name == params[bare].name + ".exp_avg_sq";
    });
    ASSERT_EQ(partial.tensors.size(), state.tensors.size() - 2);
    auto target = model::make_layer(job->model, 2, 11, chip->torch_device());
    runtime::restore_layer(*chip, *target, partial);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto& got = target->parameters()[i];
      EXPECT_TRUE(at::equal(got.value, params[i].value)) << got.name;
      if (i == bare) {
        EXPECT_FALSE(got.exp_avg.defined()) << got.name;
        EXPECT_FALSE(got.exp_avg_sq.defined()) << got.name;
      } else {
        EXPECT_TRUE(at::equal(got.exp_avg, params[i].exp_avg)) << got.name;
        EXPECT_TRUE(at::equal(got.exp_avg_sq, params[i].exp_avg_sq))
          << got.name;
      }
    }
    // What comes back is what was saved.
    EXPECT_EQ(runtime::snapshot_layer(*chip, *target), partial);
  }
}

} // namespace
} // namespace h2::test
