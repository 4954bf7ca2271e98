// Emulated chips under the virtual clock (docs/architecture.md, "Emulated chips"):
// clocks advance by exactly the cost function's time per op; on homogeneous
// chips with zero link time step time and bubble follow the schedules'
// theory; a stage past its memory cap fails naming the chip.
#include "reference_run.hpp"
#include "test_jobs.hpp"

#include "h2/actors/errors.hpp"
#include "h2/devices/emulated/cost_function.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

namespace h2::test {
namespace {

TEST(actors_emulation, clock_advances_by_exactly_the_cost_function) {
  std::string toml = small_model_toml + two_step_train_toml + R"(
[emulation]
clock = "virtual"
memory_scale = 0.01
time_scale = 3.0
[[nodes]]
chips = [{device = "emulated:mi250x", dtype = "fp32"}]
)";
  auto job = parse_job(toml, "one-chip.toml");
  recording_observer obs;
  run_job(job, obs);
  ASSERT_EQ(obs.steps.size(), 2u);

  // The chip's own cost function, applied by hand to every layer.
  const auto& chip = job.nodes[0].chips[0];
  devices::emulated_cost_function cost(chip.profile, dtype::fp32, 3.0);
  double fwd = 0, bwd = 0, opt = 0;
  for (int l = 0; l < job.model.num_layers(); ++l) {
    auto w = compute_layer_work(job.model, l, 2, dtype::fp32);
    fwd += cost.layer_seconds(w, devices::pass::forward);
    bwd += cost.layer_seconds(w, devices::pass::backward);
    opt += cost.optimizer_seconds(layer_parameters(job.model, l));
  }
  // One stage: F0 B0 F1 B1 F2 B2 F3 B3, then the update.
  double clock = 0, forward_total = 0, backward_total = 0;
  for (int mb = 0; mb < 4; ++mb) {
    clock += fwd;
    clock += bwd;
    forward_total += fwd;
    backward_total += bwd;
  }
  double pipeline = clock;
  clock += opt;
  const auto& s = obs.steps[0];
  EXPECT_EQ(s.pipeline_seconds, pipeline);
  EXPECT_EQ(s.step_seconds, clock);
  EXPECT_EQ(s.virtual_step_seconds, clock);
  ASSERT_EQ(s.chips.size(), 1u);
  EXPECT_EQ(s.chips[0].forward_seconds, forward_total);
  EXPECT_EQ(s.chips[0].backward_seconds, backward_total);
  EXPECT_EQ(s.chips[0].optimizer_seconds, opt);
  EXPECT_EQ(s.bubble_fraction, 0.0);
  // The second step starts where the first ended.
  EXPECT_DOUBLE_EQ(obs.steps[1].virtual_end, 2 * clock);
}

/// p chips of one kind whose every layer op costs exactly 1 ms, the fixed
/// overhead:
/// compute and memory traffic are 1e-21 s on this profile, below half an
/// ulp of 1e-3, so they vanish in the sum.
std::string uniform_job(int stages, int micro_batches,
                        const std::string& schedule) {
  std::ostringstream toml;
  toml << R"(
[profiles.uniform]
vendor = "Test"
peak_tflops = { fp32 = 1e15, bf16 = 1e15, fp16 = 1e15 }
memory_gib = 64
memory_bandwidth_gb_per_s = 1e18
interconnect_gb_per_s = 1e18
[profiles.uniform.emulation]
op_overhead_seconds = 1e-3
link_latency_seconds = 1e-9
[model]
vocab_size = 17
seq_len = 8
d_model = 16
n_head = 2
n_layer = )"
       << 3 * stages - 2 << R"(
d_ff = 32
[data]
source = "markov"
entropy_rate = 1.0
[train]
steps = 1
global_batch = )"
       << micro_batches << R"(
micro_batch = 1
[emulation]
clock = "virtual"
memory_scale = 0.01
link_latency_seconds = 0
link_bandwidth_bytes_per_second = inf
[[nodes]]
chips = [)";
  for (int s = 0; s < stages; ++s)
    toml << (s ? ", " : "")
         << "{device = \"emulated:uniform\", dtype = "
            "\"fp32\"}";
  toml << "]\n[plan]\nschedule = \"" << schedule << "\"\n";
  if (schedule == "interleaved-1f1b") // a chunk per layer
    toml << "chunks_per_chip = 3\n";
  return toml.str();
}

struct theory_case {
  int stages;
  int micro_batches;
  std::string schedule;
};

class actors_emulation_theory : public ::testing::TestWithParam<theory_case> {};

TEST_P(actors_emulation_theory, step_time_and_bubble_match_the_schedule) {
  const auto& c = GetParam();
  auto job = parse_job(uniform_job(c.stages, c.micro_batches, c.schedule),
                       "uniform.toml");
  recording_observer obs;
  run_job(job, obs);
  ASSERT_EQ(obs.steps.size(), 1u);
  const auto& s = obs.steps[0];
  // Even plan: 3 layers per chip; every op of a chip (forward, backward,
  // B, W, update) is 3 ops of 1 ms. So F = B (fused) under GPipe and 1F1B,
  // and F = B = W under ZB-H1: the premises of the textbook bubbles.
  // Interleaved: 3 chunks of one layer per chip, each op 1 ms.
  const double unit = 3e-3;
  const auto kind = *parse_schedule_kind(c.schedule);
  const int p = c.stages, m = c.micro_batches;
  const int v = kind == schedule_kind::interleaved_1f1b ? 3 : 1;
  const double busy = m * unit * (scheduler::splits_backward(kind) ? 3 : 2);
  const double bubble = scheduler::theoretical_bubble(kind, p, m, v);
  const double pipeline = busy / (1 - bubble);
  EXPECT_NEAR(s.pipeline_seconds, pipeline, 1e-12);
  EXPECT_NEAR(s.step_seconds, pipeline + unit, 1e-12);
  EXPECT_NEAR(s.bubble_fraction, bubble, 1e-9);
  for (const auto& chip : s.chips) {
    EXPECT_NEAR(chip.forward_seconds, m * unit, 1e-12);
    EXPECT_NEAR(chip.idle_seconds, pipeline - busy, 1e-12);
  }
}

std::ostream& operator<<(std::ostream& out, const theory_case& c) {
  return out << c.schedule << " " << c.stages << "x" << c.micro_batches;
}

std::string theory_name(const ::testing::TestParamInfo<theory_case>& info) {
  std::string name = info.param.schedule + "_" +
                     std::to_string(info.param.stages) + "x" +
                     std::to_string(info.param.micro_batches);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(
  homogeneous, actors_emulation_theory,
  ::testing::Values(theory_case{1, 4, "1f1b"}, theory_case{2, 4, "1f1b"},
                    theory_case{3, 2, "1f1b"}, theory_case{4, 8, "1f1b"},
                    theory_case{4, 1, "1f1b"}, theory_case{2, 4, "gpipe"},
                    theory_case{4, 8, "gpipe"}, theory_case{3, 5, "gpipe"},
                    theory_case{2, 4, "zb-h1"}, theory_case{3, 5, "zb-h1"},
                    theory_case{4, 8, "zb-h1"}, theory_case{4, 8, "zb-hetero"},
                    theory_case{2, 4, "interleaved-1f1b"},
                    theory_case{4, 8, "interleaved-1f1b"}),
  theory_name);

TEST(actors_emulation, stage_past_its_memory_cap_fails_naming_the_chip) {
  // Chip 0:0 (MI300X, 192 GiB) holds the embedding; chip 0:1 (A100 40 GiB,
  // 4.8x less memory) holds every block and the head and cannot.
  std::string toml = small_model_toml + two_step_train_toml + R"(
[emulation]
clock = "virtual"
memory_scale = 2e-6
[[nodes]]
chips = [{device = "emulated:mi300x", dtype = "fp32"},
         {device = "emulated:a100-sxm-40gb", dtype = "fp32"}]
[plan]
mode = "manual"
layers = [1, 5]
)";
  auto job = parse_job(toml, "oom.toml");
  recording_observer obs;
  try {
    run_job(job, obs);
    FAIL() << "expected an out-of-memory failure";
  } catch (const actors::run_error& e) {
    EXPECT_EQ(e.code(), actors::errc::out_of_memory) << e.what();
    EXPECT_NE(std::string(e.what()).find("0:1"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("0:0"), std::string::npos) << e.what();
  }
}

TEST(actors_emulation, chip_past_the_step_timeout_fails_the_run) {
  // Wall clock, every emulated time x 1e5: each op takes seconds to wait
  // out, so no chip answers a step within runtime.step_timeout_seconds. The
  // run fails with a step timeout naming a chip and the key, and the chips
  // stop waiting (else this test would hang until CTest's timeout).
  std::string toml = small_model_toml + two_step_train_toml + R"(
[emulation]
clock = "wall"
time_scale = 1e5
[runtime]
step_timeout_seconds = 0.2
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x"]
)";
  auto job = parse_job(toml, "slow.toml");
  recording_observer obs;
  try {
    run_job(job, obs);
    FAIL() << "expected a step timeout";
  } catch (const actors::run_error& e) {
    EXPECT_EQ(e.code(), actors::errc::step_timeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("runtime.step_timeout_seconds"),
              std::string::npos)
      << e.what();
    EXPECT_NE(std::string(e.what()).find("chip 0:"), std::string::npos)
      << e.what();
  }
  EXPECT_TRUE(obs.steps.empty());
}

/// A job of `chips` whose chip `hung` hangs at its first compute op of
/// step 1 ([[drills]] hang), with a watchdog floor of 0.2 s.
job_config hanging_job(const std::string& chips, const std::string& hung) {
  return parse_job(small_model_toml + two_step_train_toml +
                     "[emulation]\nclock = \"virtual\"\n"
                     "[watchdog]\nfactor = 20\nfloor_seconds = 0.2\n"
                     "[[nodes]]\nchips = " +
                     chips + "\n[[drills]]\nstep = 1\nhang = \"" + hung +
                     "\"\n",
                   "hang.toml");
}

/// Runs `job`, which must fail with chip `chip` stalled in `what`.
void expect_stalled(const job_config& job, const std::string& what,
                    recording_observer& obs) {
  try {
    run_job(job, obs);
    FAIL() << "expected a stalled chip";
  } catch (const actors::run_error& e) {
    EXPECT_EQ(e.code(), actors::errc::stalled) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(actors_emulation, a_hung_chip_is_reported_as_stalled) {
  // One chip, one stage: no neighbour would ever notice. Its forward of
  // step 1 hangs until the watchdog gives up on it; the run fails with the
  // chip named (no step timeout: that is 600 s away).
  auto job = hanging_job("[\"emulated:h100-sxm\"]", "0:0");
  ASSERT_EQ(job.runtime.step_timeout_seconds, 600);
  recording_observer obs;
  expect_stalled(job, "chip 0:0 stalled: its forward of micro-batch 0", obs);
  EXPECT_EQ(obs.steps.size(), 1u); // step 0 trained
}

TEST(actors_emulation, a_hung_chip_is_named_not_its_waiting_neighbours) {
  // Two stages: chip 0:0 waits for 0:1's gradients while 0:1 hangs; the
  // stall is the root cause, not the neighbour's cancelled wait.
  recording_observer obs;
  expect_stalled(
    hanging_job("[\"emulated:h100-sxm\", \"emulated:mi250x\"]", "0:1"),
    "chip 0:1 stalled", obs);
}

} // namespace
} // namespace h2::test
