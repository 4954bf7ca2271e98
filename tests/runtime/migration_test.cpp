// Live re-plans chip to chip (docs/rebalance.md, "Moving layers"): which
// layers each chip sends and receives, when they must go through the
// scheduler instead, and a moved layer's state on the wire: in one process
// the sender's memory, its charge moved; copied once otherwise; refused
// when it is not the layer's.
#include "h2/core/error.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/optim.hpp"
#include "h2/runtime/migration.hpp"
#include "h2/runtime/safetensors.hpp"
#include "h2/transport/inproc/backend.hpp"
#include "layer_fixtures.hpp"
#include "test_jobs.hpp"

#include <ATen/ops/ones.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

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
  // Each chip works out its own part alike.
  for (const auto& [chip, part] : m.chips) {
    const auto own =
      runtime::chip_part_of(*job, one_replica_plan(*job, {2, 2, 2}, 2, 4),
                            one_replica_plan(*job, {3, 2, 1}, 2, 4), chip);
    EXPECT_EQ(own.sends.size(), part.sends.size()) << chip.to_string();
    EXPECT_EQ(own.receives.size(), part.receives.size()) << chip.to_string();
    for (std::size_t i = 0; i < own.sends.size(); ++i)
      EXPECT_TRUE(own.sends[i].layer == part.sends[i].layer &&
                  own.sends[i].peer == part.sends[i].peer);
    for (std::size_t i = 0; i < own.receives.size(); ++i)
      EXPECT_TRUE(own.receives[i].layer == part.receives[i].layer &&
                  own.receives[i].peer == part.receives[i].peer);
  }
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

/// `state` as the messages that carry it.
std::vector<transport::message> messages_of(std::vector<at::Tensor> state) {
  std::vector<transport::message> out(state.size());
  for (std::size_t i = 0; i < state.size(); ++i)
    out[i].tensor = std::move(state[i]);
  return out;
}

TEST(runtime_migration, in_one_process_a_moved_layer_keeps_its_memory) {
  for (const auto& toml : {small_model_toml, small_tied_llama_model_toml})
    for (int index : {0, 2, 5}) {
      auto job = three_chips_of(toml);
      const auto& cfg = job->model;
      ASSERT_EQ(cfg.num_layers(), 6);
      auto from = chip_of(*job, 0), to = chip_of(*job, 1);
      const auto from_empty = from->usage().used, to_empty = to->usage().used;
      auto original = updated_layer(*job, index, *from);
      std::vector<std::pair<at::Tensor, const void*>> want; // copy, place
      for (const auto& p : original->parameters())
        for (const auto* t : {&p.value, &p.exp_avg, &p.exp_avg_sq})
          want.emplace_back(t->detach().clone(), t->data_ptr());
      auto state = runtime::give_up_layer(std::move(original));
      ASSERT_EQ(state.size(), runtime::moved_state_messages);
      // In transit: the giver pays no more, the taker not yet.
      EXPECT_EQ(from->usage().used, from_empty);
      EXPECT_EQ(to->usage().used, to_empty);
      std::unique_ptr<model::layer> moved;
      {
        devices::thread_binding bind(*to);
        moved = runtime::take_over_layer(cfg, index,
                                         messages_of(std::move(state)), *to);
      }
      // Nothing copied: the same bytes, now charged to the new chip alone.
      EXPECT_EQ(from->usage().used, from_empty);
      EXPECT_EQ(to->usage().used - to_empty,
                static_cast<std::uint64_t>(layer_parameters(cfg, index)) * 12);
      std::size_t k = 0;
      for (const auto& p : moved->parameters()) {
        EXPECT_TRUE(p.value.requires_grad()) << p.name;
        for (const auto* t : {&p.value, &p.exp_avg, &p.exp_avg_sq}) {
          EXPECT_TRUE(at::equal(*t, want[k].first)) << p.name;
          EXPECT_EQ(t->data_ptr(), want[k].second) << p.name;
          EXPECT_TRUE(to->holds(*t)) << p.name;
          ++k;
        }
      }
      EXPECT_EQ(k, want.size());
      // Still one buffer for the values and one for the moments.
      EXPECT_EQ(model::flat_values(*moved).data_ptr(),
                moved->parameters().front().value.data_ptr());
      EXPECT_EQ(model::flat_moments(*moved).data_ptr(),
                moved->parameters().front().exp_avg.data_ptr());
    }
}

TEST(runtime_migration, a_layer_handed_between_chip_threads_moves_its_charge) {
  // The route of a live re-plan in one process: the giver's thread sends,
  // the taker's thread receives over an inproc channel (run under TSan).
  auto job = three_chips();
  const auto& cfg = job->model;
  auto from = chip_of(*job, 0), to = chip_of(*job, 1);
  const auto from_empty = from->usage().used, to_empty = to->usage().used;
  auto [giver, taker] = transport::inproc::make_pair();
  const auto tag = runtime::layer_move_tag(3, 2);
  std::vector<transport::pending_message> parts;
  for (std::size_t k = 0; k < runtime::moved_state_messages; ++k)
    parts.push_back(taker->recv_async(tag));
  std::unique_ptr<model::layer> moved;
  std::thread receiver([&] {
    devices::thread_binding bind(*to);
    std::vector<transport::message> state(parts.size());
    for (std::size_t k = parts.size(); k-- > 0;)
      state[k] = parts[k].get(std::chrono::seconds(30));
    moved = runtime::take_over_layer(cfg, 2, std::move(state), *to);
  });
  const void* sent = nullptr;
  std::thread sender([&, &giver = giver] {
    auto state = runtime::give_up_layer(updated_layer(*job, 2, *from));
    sent = state[0].data_ptr();
    for (auto& t : state) {
      transport::message m;
      m.tag = tag;
      m.tensor = std::move(t);
      giver->send(std::move(m));
    }
  });
  sender.join();
  receiver.join();
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(model::flat_values(*moved).data_ptr(), sent); // not copied
  EXPECT_EQ(from->usage().used, from_empty);
  EXPECT_EQ(to->usage().used - to_empty,
            static_cast<std::uint64_t>(layer_parameters(cfg, 2)) * 12);
  for (const auto& p : moved->parameters())
    EXPECT_TRUE(to->holds(p.value) && to->holds(p.exp_avg)) << p.name;
  moved.reset();
  EXPECT_EQ(to->usage().used, to_empty);
}

TEST(runtime_migration, state_held_elsewhere_is_copied_once_to_the_new_chip) {
  auto job = three_chips();
  const auto& cfg = job->model;
  auto from = chip_of(*job, 0), to = chip_of(*job, 1);
  // Before the first update: values, and an empty message for the moments.
  std::unique_ptr<model::layer> original;
  {
    devices::thread_binding bind(*from);
    original = model::make_layer(cfg, 2, 7, from->torch_device());
  }
  const auto from_used = from->usage().used, to_empty = to->usage().used;
  const auto values = model::flat_values(*original); // held elsewhere too
  const auto params = original->parameters().size();
  auto state = runtime::give_up_layer(std::move(original));
  ASSERT_EQ(state.size(), 2u);
  EXPECT_FALSE(state[1].defined());
  std::unique_ptr<model::layer> moved;
  {
    devices::thread_binding bind(*to);
    moved =
      runtime::take_over_layer(cfg, 2, messages_of(std::move(state)), *to);
  }
  // The sender still holds its values, and pays for them; the receiver
  // pays for its copy.
  EXPECT_EQ(from->usage().used, from_used);
  EXPECT_EQ(to->usage().used - to_empty,
            static_cast<std::uint64_t>(layer_parameters(cfg, 2)) * 4);
  ASSERT_EQ(moved->parameters().size(), params);
  const auto got = model::flat_values(*moved);
  EXPECT_NE(got.data_ptr(), values.data_ptr());
  EXPECT_TRUE(at::equal(got, values));
  for (const auto& p : moved->parameters()) {
    EXPECT_TRUE(to->holds(p.value)) << p.name;
    EXPECT_FALSE(p.exp_avg.defined()) << p.name;
  }
}

TEST(runtime_migration, a_state_that_is_not_the_layers_is_refused) {
  auto job = three_chips();
  const auto& cfg = job->model;
  auto from = chip_of(*job, 0), to = chip_of(*job, 1);
  const auto good = [&] {
    return messages_of(runtime::give_up_layer(updated_layer(*job, 1, *from)));
  };
  const auto n = layer_parameters(cfg, 1);
  const auto values = std::to_string(n) + " contiguous fp32 values expected";
  std::vector<std::pair<std::vector<transport::message>, std::string>> cases;
  auto shorter = good();
  shorter.pop_back();
  cases.emplace_back(std::move(shorter),
                     "layer 1: 2 messages of its state expected, 1 came");
  auto longer = good();
  longer[0].tensor = at::zeros({n + 1});
  cases.emplace_back(std::move(longer), "layer 1, its values: " + values +
                                          ", got [" + std::to_string(n + 1) +
                                          "] of Float");
  auto wrong_type = good();
  wrong_type[0].tensor = at::zeros({n}, at::kDouble);
  cases.emplace_back(std::move(wrong_type), "of Double");
  auto two_d = good();
  two_d[0].tensor = at::zeros({1, n});
  cases.emplace_back(std::move(two_d), "got [1, " + std::to_string(n) + "]");
  auto bytes = good();
  bytes[0].tensor = at::Tensor();
  bytes[0].bytes.resize(5);
  cases.emplace_back(std::move(bytes), "got a message of 5 bytes");
  auto one_moment = good();
  one_moment[1].tensor = at::zeros({n});
  cases.emplace_back(std::move(one_moment),
                     "layer 1, its AdamW moments: " + std::to_string(2 * n) +
                       " contiguous fp32 values expected");
  devices::thread_binding bind(*to);
  for (auto& [messages, want] : cases) {
    try {
      runtime::take_over_layer(cfg, 1, std::move(messages), *to);
      ADD_FAILURE() << "accepted a state that should contain: " << want;
    } catch (const runtime::checkpoint_error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
        << e.what();
    }
  }
}

} // namespace
} // namespace h2::test
