// docs/architecture.md, "Correctness anchors": pipeline-parallel training on N stages
// equals single-chip training of the same model over the same micro-batches,
// bitwise in fp32 with one intra-op thread, for every schedule.
#include "reference_run.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include "h2/devices/cpu_bf16.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace h2::test {
namespace {

/// A small GPT (4 blocks: 6 layers) on up to four emulated chips of three
/// vendors, virtual clock.
std::string exact_job(const std::string& dtype, int stages,
                      const std::string& layers, const std::string& schedule,
                      const std::string& recompute = "",
                      const std::string& model = small_model_toml) {
  std::ostringstream toml;
  toml << small_job_toml(7, model) << R"(
[[nodes]]
chips = [)";
  const char* kinds[] = {"h100-sxm", "mi250x", "a100-sxm-80gb", "mi300x"};
  for (int i = 0; i < 4; ++i)
    toml << (i ? ", " : "") << "{device = \"emulated:" << kinds[i]
         << "\", dtype = \"" << (i % 2 == 1 ? dtype : std::string("fp32"))
         << "\"}";
  toml << "]\n[plan]\nmode = \"manual\"\nschedule = \"" << schedule
       << "\"\nstages = [";
  for (int s = 0; s < stages; ++s)
    toml << (s ? ", " : "") << "\"0:" << s << "\"";
  toml << "]\nlayers = " << layers << "\n";
  if (schedule == "interleaved-1f1b") // `stages` chips of two chunks each
    toml << "chunks_per_chip = 2\n";
  if (!recompute.empty())
    toml << "recompute = " << recompute << "\n";
  return toml.str();
}

struct exact_case {
  int stages;
  std::string layers;
  std::string schedule;
  std::string recompute;
  std::string model = small_model_toml;
};

std::ostream& operator<<(std::ostream& out, const exact_case& c) {
  return out << c.schedule << ", layers " << c.layers << " " << c.recompute;
}

std::string case_name(const ::testing::TestParamInfo<exact_case>& info) {
  std::string name = info.param.schedule + "_" +
                     std::to_string(info.param.stages) + "_stages";
  for (auto& ch : name)
    if (ch == '-')
      ch = '_'; // gtest names: letters, digits, underscores
  if (!info.param.recompute.empty())
    name += "_recompute";
  if (info.param.recompute.find('"') != std::string::npos)
    name += "_selective";
  if (info.param.model == small_llama_model_toml)
    name += "_llama";
  if (info.param.model == small_tied_llama_model_toml)
    name += "_tied_llama";
  return name;
}

class actors_exactness : public ::testing::TestWithParam<exact_case> {};

TEST_P(actors_exactness, pipeline_equals_single_chip_bitwise) {
  const auto& c = GetParam();
  auto job = parse_job(
    exact_job("fp32", c.stages, c.layers, c.schedule, c.recompute, c.model),
    "exact.toml");
  recording_observer obs;
  std::vector<runtime::parameter_values> params;
  run_job(job, obs, &params);
  auto kind = *parse_schedule_kind(c.schedule);
  auto ref = train_reference(job, kind, c.stages);

  auto losses = obs.losses();
  ASSERT_EQ(losses.size(), ref.losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i)
    EXPECT_EQ(losses[i], ref.losses[i]) << "step " << i;
  ASSERT_EQ(params.size(), ref.params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(params[i].name, ref.params[i].name);
    ASSERT_EQ(params[i].values.size(), ref.params[i].values.size());
    EXPECT_EQ(0,
              std::memcmp(params[i].values.data(), ref.params[i].values.data(),
                          params[i].values.size() * sizeof(float)))
      << params[i].name << " differs";
  }
  // The run trained: the loss moved.
  EXPECT_NE(losses.front(), losses.back());
  // Tied: the head's copy is the embedding, bit for bit.
  if (job.model.tie_embeddings) {
    const auto& wte = params.front();
    const auto& head = params.back();
    ASSERT_EQ(wte.name, "embedding.wte");
    ASSERT_EQ(head.name, "head.lm_head.weight");
    EXPECT_EQ(wte.values, head.values);
  }
}

INSTANTIATE_TEST_SUITE_P(
  schedules_and_partitions, actors_exactness,
  ::testing::Values(
    exact_case{1, "[6]", "gpipe", ""}, exact_case{1, "[6]", "1f1b", ""},
    exact_case{2, "[4, 2]", "gpipe", ""}, exact_case{2, "[4, 2]", "1f1b", ""},
    exact_case{3, "[1, 3, 2]", "gpipe", ""},
    exact_case{3, "[1, 3, 2]", "1f1b", ""},
    exact_case{4, "[2, 1, 1, 2]", "gpipe", ""},
    exact_case{4, "[2, 1, 1, 2]", "1f1b", ""},
    exact_case{3, "[2, 1, 3]", "1f1b", "[true, false, true]"},
    exact_case{1, "[6]", "zb-h1", ""}, exact_case{2, "[4, 2]", "zb-h1", ""},
    exact_case{3, "[1, 3, 2]", "zb-h1", ""},
    exact_case{4, "[2, 1, 1, 2]", "zb-h1", ""},
    exact_case{3, "[2, 1, 3]", "zb-h1", "[true, false, true]"},
    // Selective recomputation: whole blocks and attention cores (B
    // recomputes them, so zb-h1's B computes those blocks' weight
    // gradients too).
    exact_case{3, "[2, 1, 3]", "1f1b",
               R"(["1 block + attention", "attention", "2 blocks"])"},
    exact_case{3, "[2, 1, 3]", "zb-h1",
               R"(["attention", "1 block", "1 block + attention"])",
               small_llama_model_toml},
    exact_case{4, "[2, 1, 1, 2]", "zb-hetero", ""},
    // Chips of two chunks each, dealt: chip 0 holds
    // chunks 0 and 2, chip 1 chunks 1 and 3, ...
    exact_case{2, "[2, 1, 1, 2]", "interleaved-1f1b", ""},
    exact_case{3, "[1, 1, 1, 1, 1, 1]", "interleaved-1f1b", ""},
    exact_case{2, "[1, 2, 2, 1]", "interleaved-1f1b",
               "[true, false, false, true]"},
    // The llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention).
    exact_case{2, "[4, 2]", "1f1b", "", small_llama_model_toml},
    exact_case{4, "[2, 1, 1, 2]", "zb-h1", "", small_llama_model_toml},
    exact_case{3, "[2, 1, 3]", "gpipe", "[true, false, true]",
               small_llama_model_toml},
    exact_case{2, "[2, 1, 1, 2]", "interleaved-1f1b", "",
               small_llama_model_toml},
    // Tied embeddings: on one chip, across a pipeline (the end chips sum
    // the tied gradient), and with the zero-bubble split backward.
    exact_case{1, "[6]", "1f1b", "", small_tied_llama_model_toml},
    exact_case{3, "[2, 1, 3]", "1f1b", "", small_tied_llama_model_toml},
    exact_case{4, "[2, 1, 1, 2]", "zb-h1", "", small_tied_llama_model_toml}),
  case_name);

// zb-hetero on chips of several chunks, two each or uneven (chip 0:0 holds
// the first and the last chunk): the greedy run's lists, bitwise the
// single-chip trainer in fp32.
TEST(actors_exactness_chunks, zb_hetero_on_chips_of_several_chunks) {
  auto job =
    parse_job(exact_job("fp32", 3, "[2, 2, 2]", "zb-hetero"), "chunks.toml");
  const auto ref = train_reference(job, schedule_kind::zb_hetero, 3);
  auto stage = [](int chip, int first, int end) {
    return stage_plan{chip_id{0, chip}, first, end, false};
  };
  for (const auto& stages :
       {std::vector<stage_plan>{stage(0, 0, 1), stage(1, 1, 3), stage(2, 3, 5),
                                stage(0, 5, 6)},
        std::vector<stage_plan>{stage(0, 0, 2), stage(1, 2, 3), stage(0, 3, 5),
                                stage(1, 5, 6)}}) {
    plan p = scheduler::make_plan(job);
    p.replicas[0].stages = stages;
    SCOPED_TRACE(to_json(p, -1));
    scheduler::check_plan(p, job, "plan");
    actors::local_job local(std::make_shared<job_config>(job), p);
    recording_observer obs;
    local.run({job.train.steps, true}, obs);
    EXPECT_EQ(obs.losses(), ref.losses);
    const auto params = local.parameters();
    ASSERT_EQ(params.size(), ref.params.size());
    for (std::size_t i = 0; i < params.size(); ++i)
      EXPECT_EQ(params[i].values, ref.params[i].values) << params[i].name;
  }
}

// bf16 chips (stages 1 and 3 of 4) against the fp32 single-chip reference.
// The bounds: bf16 keeps 8 significant bits (unit roundoff 2^-9 = 0.2%);
// matmuls accumulate in fp32 and the loss is computed in fp32, so each
// layer adds a rounding error of about 2^-8 relative to its activations and
// the 6 layers of this model stay well under 2% of the loss. Parameters:
// AdamW moves a parameter by at most about lr (1 + weight decay) per step
// whatever its gradient, so two runs that differ only in rounding can part
// by at most 2 lr per step: 2 * 1e-2 * 3 steps = 0.06.
/// Runs the 4-chip 1f1b job of `model` with bf16 chips 1 and 3 and checks
/// it against the fp32 single-chip reference within the bound above.
std::pair<std::vector<double>, std::vector<runtime::parameter_values>>
bf16_run_within_bound(const std::string& model) {
  auto job = parse_job(exact_job("bf16", 4, "[2, 1, 1, 2]", "1f1b", "", model),
                       "bf16.toml");
  recording_observer obs;
  std::vector<runtime::parameter_values> params;
  run_job(job, obs, &params);
  auto ref = train_reference(job, schedule_kind::one_f_one_b, 4);
  auto losses = obs.losses();
  EXPECT_EQ(losses.size(), ref.losses.size());
  bool any_difference = false;
  for (std::size_t i = 0; i < losses.size() && i < ref.losses.size(); ++i) {
    EXPECT_LE(std::abs(losses[i] - ref.losses[i]), 0.02 * ref.losses[i])
      << "step " << i;
    any_difference |= losses[i] != ref.losses[i];
  }
  // bf16 math really ran: the losses are not bitwise the fp32 ones.
  EXPECT_TRUE(any_difference);
  double max_diff = 0;
  EXPECT_EQ(params.size(), ref.params.size());
  for (std::size_t i = 0; i < params.size() && i < ref.params.size(); ++i)
    for (std::size_t j = 0; j < params[i].values.size(); ++j)
      max_diff =
        std::max(max_diff, static_cast<double>(std::abs(
                             params[i].values[j] - ref.params[i].values[j])));
  EXPECT_LE(max_diff, 2 * job.train.lr * job.train.steps);
  return {losses, params};
}

TEST(actors_exactness_bf16, bf16_chips_stay_within_the_stated_bound) {
  {
    SCOPED_TRACE("llama");
    bf16_run_within_bound(small_llama_model_toml);
  }
  const auto [losses, params] = bf16_run_within_bound(small_model_toml);

  // zb-h1 on the same chips: B and W run the same bf16 kernels on the same
  // saved tensors as the fused backward, so it stays within the bound by
  // being bitwise the 1f1b run.
  auto zb = parse_job(exact_job("bf16", 4, "[2, 1, 1, 2]", "zb-h1"), "zb.toml");
  recording_observer zb_obs;
  std::vector<runtime::parameter_values> zb_params;
  run_job(zb, zb_obs, &zb_params);
  EXPECT_EQ(zb_obs.losses(), losses);
  ASSERT_EQ(zb_params.size(), params.size());
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(zb_params[i].values, params[i].values) << params[i].name;
}

/// The demo job (examples/demo.toml) on the virtual clock for 50 steps,
/// its bf16 chips computing their GEMMs as `path` asks.
job_config demo_job(const std::string& path) {
  std::ifstream in(std::string(H2_SOURCE_DIR) + "/examples/demo.toml");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  auto set = [&](const std::string& from, const std::string& to) {
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  };
  set("clock = \"wall\"", "clock = \"virtual\"");
  set("steps = 300", "steps = 50");
  set("port = 9400", "port = 0");
  text += "\n[ditorch]\ncpu_bf16 = \"" + path + "\"\n";
  return parse_job(text, "demo-" + path + ".toml");
}

// The two ways a host computes bf16 GEMMs (docs/emulation.md, "bf16 on the
// host CPU") train the demo alike: every step's loss within the bound
// above (2%), with the live rebalance and the drill of the demo.
TEST(actors_exactness_bf16, the_demo_trains_alike_on_both_host_bf16_paths) {
  if (devices::host_cpu_bf16(cpu_bf16::automatic).path != cpu_bf16::native)
    GTEST_SKIP() << devices::describe(
      devices::host_cpu_bf16(cpu_bf16::automatic));
  recording_observer native, accumulate;
  run_job(demo_job("native"), native);
  run_job(demo_job("fp32-accumulate"), accumulate);
  const auto a = native.losses(), b = accumulate.losses();
  ASSERT_EQ(a.size(), 50u);
  ASSERT_EQ(b.size(), 50u);
  bool any_difference = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(a[i] - b[i]), 0.02 * a[i]) << "step " << i;
    any_difference |= a[i] != b[i];
  }
  // The paths really differ (their sums run in other orders) ...
  EXPECT_TRUE(any_difference);
  // ... and both learn.
  EXPECT_LT(b.back(), 0.8 * b.front());
}

} // namespace
} // namespace h2::test
