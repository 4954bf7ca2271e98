// The scheduler acts only on messages from the senders they belong to
// (docs/transport.md, "TLS"): a checkpoint's end (`saved`) and the admin
// poll only from itself, layer-file records (`written`) only from the
// replica-0 chip whose layers they name, and one `train` per scheduler. A
// rogue actor in the same actor system (what a forged client could reach
// if a port were ever open without TLS) sends each of them, for every
// step, while a checkpointed run trains: the run ends all its steps, and
// every checkpoint it published reads back whole. White-box: it drives the
// chip and scheduler actors as actors/local_job.cpp does.
#include "h2/actors/atoms.hpp"
#include "h2/actors/chip_actor.hpp"
#include "h2/actors/scheduler_actor.hpp"
#include "h2/core/files.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/links.hpp"
#include "h2/runtime/stage_worker.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "test_jobs.hpp"

#include <caf/scoped_actor.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

namespace h2::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

TEST(actors_forged_messages, the_scheduler_obeys_only_their_senders) {
  const fs::path root =
    fs::temp_directory_path() /
    ("h2-forged-test-" + std::to_string(std::random_device{}()));
  auto job = std::make_shared<job_config>(parse_job(small_job_toml(5) + R"(
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x"]
[plan]
mode = "manual"
stages = ["0:0", "0:1"]
layers = [3, 3]
[checkpoint]
every = 1
keep = 10
dir = ")" + root.string() + R"("
)",
                                                  "forged.toml"));
  job->train.steps = 6;
  const plan p = scheduler::make_plan(*job);
  const int layers = job->model.num_layers();

  caf::actor_system_config cfg;
  actors::configure_actor_system(cfg);
  caf::actor_system system{cfg};
  auto ctx = std::make_shared<actors::run_context>();
  ctx->job = job;
  ctx->the_plan = p;
  ctx->stop = std::make_shared<std::atomic<int>>(0);
  ctx->manifest = runtime::job_manifest(*job, p, "");
  ctx->checkpoints =
    std::make_shared<runtime::checkpoint_writer>(root, job->checkpoint.keep);
  std::map<int, transport::endpoint_address> here;
  here[0].node_rank = 0;
  auto setups = runtime::make_worker_setups(
    job, p, devices::chip_clock::wall_clock::now(),
    std::make_shared<cancellation>());
  std::vector<std::shared_ptr<transport::channel>> channels;
  runtime::wire_channels(
    setups, runtime::assign_links(p, here, "")[0], *job, nullptr,
    transport::deadline::max(),
    [&](const std::shared_ptr<transport::channel>& ch) {
      channels.push_back(ch);
    });
  for (auto& w : setups) {
    actors::chip_options co;
    co.writer = ctx->checkpoints;
    ctx->chips.push_back(
      system.spawn<caf::detached>(actors::chip_actor, std::move(w), co));
  }
  auto scheduler = actors::spawn_scheduler(system, ctx);

  // Every message a forger could address to the scheduler, for every step:
  // failed and finished saves, records of every layer (and a failed write),
  // admin polls (this run has no [admin]: no inbox), a second run.
  // The forger starts once the run's own train request is sent: its second
  // run must find the scheduler running, not start first.
  std::atomic<bool> training{true}, requested{false};
  std::thread rogue([&] {
    while (!requested.load())
      std::this_thread::sleep_for(1ms);
    caf::scoped_actor forger{system};
    std::vector<runtime::file_record> every_layer;
    for (int l = 0; l < layers; ++l)
      every_layer.push_back({runtime::layer_file_name(l), l, 1, 0, {}});
    const auto forged = actors::make_error(actors::errc::failed, "forged");
    while (training.load()) {
      for (std::int64_t step = 0; step <= job->train.steps; ++step) {
        forger->send(scheduler, actors::saved_atom::value, step, forged);
        forger->send(scheduler, actors::saved_atom::value, step, caf::error{});
        forger->send(scheduler, actors::written_atom::value, step, every_layer,
                     caf::error{});
        forger->send(scheduler, actors::written_atom::value, step,
                     std::vector<runtime::file_record>{}, forged);
      }
      forger->send(scheduler, actors::wake_atom::value, false);
      forger->send(scheduler, actors::wake_atom::value, true);
      forger->send(scheduler, actors::train_atom::value, 2);
      std::this_thread::sleep_for(2ms);
    }
  });

  std::optional<runtime::run_summary> summary;
  std::optional<actors::failure> failed;
  {
    caf::scoped_actor self{system};
    // A hang guard only: the run takes seconds.
    auto run = self->request(scheduler, std::chrono::seconds(300),
                             actors::train_atom::value, job->train.steps);
    requested.store(true);
    run.receive([&](runtime::run_summary& s) { summary = s; },
                [&](caf::error& e) { failed = actors::to_failure(e); });
    training.store(false);
    rogue.join();
    for (auto& chip : ctx->chips)
      self->send_exit(chip, caf::exit_reason::user_shutdown);
    self->send_exit(scheduler, caf::exit_reason::user_shutdown);
  }
  ctx->checkpoints->close();
  for (auto& ch : channels)
    ch->close();
  ctx->chips.clear();

  ASSERT_FALSE(failed) << failed->message;
  ASSERT_TRUE(summary);
  EXPECT_EQ(summary->steps, job->train.steps);
  // Every step's checkpoint was published only once its files were on
  // disk: each reads back, every layer from its own file.
  for (int step = 1; step <= job->train.steps; ++step) {
    const auto dir = runtime::checkpoint_dir(root, step);
    const auto c = runtime::read_checkpoint(dir);
    EXPECT_EQ(c.manifest.step, step);
    EXPECT_EQ(static_cast<int>(c.layers.size()), layers) << dir;
  }
  h2::remove_tree(root);
}

} // namespace
} // namespace h2::test
