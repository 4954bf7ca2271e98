// Live re-plans chip to chip (docs/rebalance.md, "Moving layers"): which
// layers each chip sends and receives, when they must go through the
// scheduler instead, and a moved layer's state on the wire: built over the
// received buffer without a copy, refused when it is not the layer's.
#include "h2/core/error.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/optim.hpp"
#include "h2/runtime/migration.hpp"
#include "h2/runtime/safetensors.hpp"
#include "test_jobs.hpp"

#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>

#include <gtest/gtest.h>

namespace h2::test {
namespace {

std::shared_ptr<job_config> three_chips() {
  return std::make_shared<job_config>(parse_job(small_job_toml(5) + R"(
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x", "emulated:a100-sxm-80gb"]
)",
                                                "migration.toml"));
}

bool same(const std::vector<runtime::layer_transfer>& got,
          const std::vector<std::pair<int, chip_id>>& want) {
  if (got.size() != want.size())
    return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i].layer != want[i].first || got[i].peer != want[i].second)
      return false;
  return true;
}

TEST(runtime_migration,
     each_chip_sends_and_receives_the_layers_that_change_owner) {
  auto job = three_chips();
  const chip_id a{0, 0}, b{0, 1}, c{0, 2};
  const auto m =
    runtime::migration_of(*job, one_replica_plan(*job, {2, 2, 2}, 2, 4),
                          one_replica_plan(*job, {3, 2, 1}, 2, 4));
  EXPECT_EQ(m.indirect, "");
  ASSERT_EQ(m.chips.size(), 3u);
  EXPECT_TRUE(same(m.chips.at(a).receives, {{2, b}}));
  EXPECT_TRUE(m.chips.at(a).sends.empty());
  EXPECT_TRUE(same(m.chips.at(b).sends, {{2, a}}));
  EXPECT_TRUE(same(m.chips.at(b).receives, {{4, c}}));
  EXPECT_TRUE(same(m.chips.at(c).sends, {{4, b}}));
  EXPECT_TRUE(m.chips.at(c).receives.empty());
}

TEST(runtime_migration,
     moves_without_a_channel_or_under_zero1_go_through_the_scheduler) {
  auto job = three_chips();
  const auto skip =
    runtime::migration_of(*job, one_replica_plan(*job, {3, 1, 2}, 2, 4),
                          one_replica_plan(*job, {1, 1, 4}, 2, 4));
  EXPECT_EQ(skip.indirect,
            "layers [2, 3) move from 0:0 to 0:2, which share no channel");
  // Two replicas of one chip each, ZeRO-1.
  auto two = std::make_shared<job_config>(parse_job(small_job_toml(5) + R"(
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:h100-sxm"]
)",
                                                    "zero1.toml"));
  plan p;
  p.zero1 = true;
  for (int i = 0; i < 2; ++i)
    p.replicas.push_back({{{chip_id{0, i}, 0, 6, false}}, 2, 2});
  EXPECT_EQ(runtime::migration_of(*two, p, p).indirect,
            "ZeRO-1 shards the moved layers' optimizer state");
}

/// A job of `model` on three chips.
std::shared_ptr<job_config> three_chips_of(const std::string& model) {
  return std::make_shared<job_config>(parse_job(small_job_toml(5, model) + R"(
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x", "emulated:a100-sxm-80gb"]
)",
                                                "family.toml"));
}

TEST(runtime_migration, a_moved_layer_is_built_over_one_buffer_bit_for_bit) {
  for (const auto& model : {small_model_toml, small_tied_llama_model_toml})
    for (int index : {0, 2, 5}) {
      auto job = three_chips_of(model);
      const auto& cfg = job->model;
      ASSERT_EQ(cfg.num_layers(), 6);
      auto original = model::make_layer(cfg, index, 7);
      // Before the first update: values only.
      auto packed = runtime::pack_layer(*original);
      EXPECT_EQ(packed.numel(), layer_parameters(cfg, index));
      // After one: both moments too.
      for (auto& p : original->parameters())
        p.value.mutable_grad() = at::ones_like(p.value);
      model::adamw_update(*original, job->train, 1e-3, 1, 1.0);
      packed = runtime::pack_layer(*original);
      ASSERT_EQ(packed.numel(), 3 * layer_parameters(cfg, index));
      auto moved = runtime::unpack_layer(cfg, index, packed);
      ASSERT_EQ(moved->parameters().size(), original->parameters().size());
      // One buffer of its own (not the received one) holds everything.
      const auto& first = moved->parameters().front().value;
      const auto* base = static_cast<const char*>(first.data_ptr());
      const auto end = base + packed.nbytes();
      EXPECT_NE(base, static_cast<const char*>(packed.data_ptr()));
      for (std::size_t i = 0; i < moved->parameters().size(); ++i) {
        const auto& got = moved->parameters()[i];
        const auto& want = original->parameters()[i];
        EXPECT_EQ(got.name, want.name);
        EXPECT_EQ(got.tied, want.tied);
        EXPECT_TRUE(got.value.requires_grad()) << got.name;
        for (const auto& [g, w] : {std::pair{got.value, want.value},
                                   {got.exp_avg, want.exp_avg},
                                   {got.exp_avg_sq, want.exp_avg_sq}}) {
          EXPECT_TRUE(at::equal(g, w)) << got.name;
          // Within the buffer: an alias, not a copy of its own.
          const auto* at = static_cast<const char*>(g.data_ptr());
          EXPECT_TRUE(at >= base && at + g.nbytes() <= end) << got.name;
        }
      }
    }
}

TEST(runtime_migration, a_moved_layer_is_charged_to_its_new_chip_only) {
  auto job = three_chips();
  const auto& cfg = job->model;
  auto device_of = [&](int index) {
    return devices::make_device(
      *job->find_chip(chip_id{0, index}), job->emulation,
      devices::chip_clock(job->emulation.clock,
                          devices::chip_clock::wall_clock::now()),
      1);
  };
  auto from = device_of(0), to = device_of(1);
  const auto from_empty = from->usage().used, to_empty = to->usage().used;
  std::unique_ptr<model::layer> original, moved;
  at::Tensor message;
  {
    devices::thread_binding bind(*from);
    original = model::make_layer(cfg, 2, 7, from->torch_device());
    message = runtime::pack_layer(*original);
    original.reset(); // the sender lets go of the layer
  }
  {
    devices::thread_binding bind(*to);
    moved = runtime::unpack_layer(cfg, 2, message, to->torch_device());
  }
  message = at::Tensor(); // the message is gone
  EXPECT_EQ(from->usage().used, from_empty) << "the sender still pays";
  EXPECT_GE(to->usage().used - to_empty,
            static_cast<std::uint64_t>(layer_parameters(cfg, 2)) * 4);
  for (const auto& p : moved->parameters())
    EXPECT_TRUE(to->holds(p.value)) << p.name;
}

TEST(runtime_migration, a_state_that_is_not_the_layers_is_refused) {
  auto job = three_chips();
  const auto& cfg = job->model;
  const auto n = layer_parameters(cfg, 1);
  for (const auto& bad : {at::zeros({n + 1}), at::zeros({2 * n}),
                          at::zeros({n}, at::kDouble), at::zeros({3, n})}) {
    try {
      runtime::unpack_layer(cfg, 1, bad);
      ADD_FAILURE() << "accepted " << bad.sizes();
    } catch (const runtime::checkpoint_error& e) {
      EXPECT_NE(std::string(e.what()).find("layer 1: a moved state of " +
                                           std::to_string(n)),
                std::string::npos)
        << e.what();
    }
  }
}

} // namespace
} // namespace h2::test
