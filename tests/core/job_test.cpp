#include "h2/core/job.hpp"

#include "expect_error.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace h2 {
namespace {

using test::expect_config_error;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string demo_path =
  std::string(H2_SOURCE_DIR) + "/examples/demo.toml";

// ---------------------------------------------------------------------------
// The demo job

TEST(core_job_demo, compiled_in_text_is_the_file) {
  EXPECT_EQ(std::string(demo_job_toml()), read_file(demo_path));
}

TEST(core_job_demo, fields) {
  job_config job = parse_job(read_file(demo_path), "demo.toml");
  EXPECT_EQ(job.origin, "demo.toml");
  EXPECT_EQ(job.name, "demo");
  EXPECT_EQ(job.seed, 1234u);

  // The model and batch are tuned with the demo; what must hold is that
  // they parse into a consistent job.
  EXPECT_EQ(job.model.d_ff, 4 * job.model.d_model); // default
  EXPECT_EQ(job.model.num_layers(), job.model.n_layer + 2);
  EXPECT_EQ(job.model.d_model % job.model.n_head, 0);
  EXPECT_EQ(job.data.source, source_kind::markov);
  EXPECT_LE(job.data.entropy_rate, 0.5 * std::log(job.model.vocab_size - 1));
  EXPECT_GE(job.train.steps, 100); // "a few hundred steps"
  EXPECT_EQ(job.train.global_batch % job.train.micro_batch, 0);
  EXPECT_GT(job.train.eval_every, 0);
  EXPECT_EQ(job.tokens_per_step(),
            std::int64_t{job.train.global_batch} * job.model.seq_len);

  EXPECT_EQ(job.emulation.clock, clock_mode::wall);
  EXPECT_GT(job.emulation.memory_scale, 0);
  // Tuned to the machine the demo runs on: only its sense is fixed.
  EXPECT_GT(job.emulation.time_scale, 1);
  EXPECT_FALSE(job.emulation.link_bandwidth_bytes_per_second.has_value());
  EXPECT_FALSE(job.emulation.link_latency_seconds.has_value());

  ASSERT_EQ(job.nodes.size(), 1u);
  EXPECT_EQ(job.nodes[0].rank, 0);
  const std::vector<std::string> devices = {
    "emulated:h100-sxm", "emulated:mi250x", "emulated:a100-sxm-40gb",
    "emulated:a100-sxm-40gb"};
  auto chips = job.chips();
  ASSERT_EQ(chips.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(chips[i]->id, (chip_id{0, i}));
    EXPECT_EQ(chips[i]->device, devices[i]);
    EXPECT_EQ(chips[i]->backend, device_backend::emulated);
    EXPECT_EQ(chips[i]->profile.name, devices[i].substr(9));
    EXPECT_EQ(chips[i]->compute_dtype, dtype::bf16); // default with bf16 peak
    EXPECT_EQ(job.find_chip(chip_id{0, i}), chips[i]);
  }
  EXPECT_EQ(job.find_chip(chip_id{0, 4}), nullptr);
  EXPECT_EQ(job.find_chip(chip_id{1, 0}), nullptr);

  EXPECT_EQ(job.plan.mode, plan_mode::even);
  EXPECT_EQ(job.plan.schedule, schedule_kind::one_f_one_b);
  EXPECT_EQ(job.plan.stages,
            (std::vector<chip_id>{{0, 0}, {0, 1}, {0, 2}, {0, 3}}));
  EXPECT_TRUE(job.plan.layers.empty());
  EXPECT_EQ(job.plan.recompute, std::vector<recompute_policy>(4));
  EXPECT_EQ(job.metrics.port, 9400);
  EXPECT_EQ(job.metrics.bind, "127.0.0.1");
  EXPECT_DOUBLE_EQ(job.transport.timeout_seconds, 60);
}

TEST(core_job_demo, cluster_is_heterogeneous) {
  job_config job = load_job_file(demo_path);
  EXPECT_EQ(job.origin, demo_path);
  std::set<std::string> kinds;
  double min_peak = INFINITY, max_peak = 0;
  double min_mem = INFINITY, max_mem = 0;
  for (const chip_spec* c : job.chips()) {
    kinds.insert(c->profile.name);
    double peak = c->profile.peak_flops(c->compute_dtype);
    EXPECT_GT(peak, 0) << c->device;
    min_peak = std::min(min_peak, peak);
    max_peak = std::max(max_peak, peak);
    double mem = static_cast<double>(c->profile.memory_bytes);
    min_mem = std::min(min_mem, mem);
    max_mem = std::max(max_mem, mem);
  }
  EXPECT_EQ(job.chips().size(), 4u);
  EXPECT_EQ(kinds.size(), 3u);
  EXPECT_GE(max_peak / min_peak, 2.0);
  EXPECT_GE(max_mem / min_mem, 1.5);
}

TEST(core_job_demo, unreadable_file_is_a_config_error) {
  const std::string path = ::testing::TempDir() + "/h2-no-such-job.toml";
  expect_config_error([&] { load_job_file(path); }, "", {path, "cannot open"});
}

// ---------------------------------------------------------------------------
// A valid base and the jobs made wrong from it

const std::string base_job = R"([job]
name = "t"
seed = 7

[model]
vocab_size = 33
seq_len = 16
d_model = 32
n_head = 4
n_layer = 2

[data]
source = "markov"
entropy_rate = 1.0

[train]
global_batch = 8
micro_batch = 2

[[nodes]]
chips = ["emulated:h100-sxm", "emulated:a100-sxm-40gb"]

[plan]
mode = "even"
)";

using edits = std::vector<std::pair<std::string, std::string>>;

/// `text` with each `from` replaced by its `to`; every `from` must occur.
std::string edit(std::string text, const edits& changes) {
  for (const auto& [from, to] : changes) {
    auto pos = text.find(from);
    if (pos == std::string::npos)
      throw std::logic_error("test bug: base job lacks \"" + from + "\"");
    text.replace(pos, from.size(), to);
  }
  return text;
}

TEST(core_job, base_is_valid) {
  job_config job = parse_job(base_job, "base.toml");
  EXPECT_EQ(job.name, "t");
  EXPECT_EQ(job.seed, 7u);
  EXPECT_EQ(job.model.num_layers(), 4);
  EXPECT_EQ(job.chips().size(), 2u);
  EXPECT_EQ(job.train.micro_batch, 2);
}

/// The smallest [model], [data] and [train] a job file can have.
const std::string tiny_model = R"(
[model]
vocab_size = 9
seq_len = 4
d_model = 8
n_head = 2
n_layer = 1
[data]
entropy_rate = 0.5
[train]
global_batch = 4
)";

TEST(core_job, defaults) {
  const std::string minimal = tiny_model + R"(
[[nodes]]
chips = ["cpu", "emulated:h100-sxm", "emulated:v100-sxm2-32gb"]
)";
  job_config job = parse_job(minimal, "<string>");
  train_config t;
  EXPECT_EQ(job.name, "h2-job");
  EXPECT_EQ(job.seed, 0u);
  EXPECT_EQ(job.model.d_ff, 32);
  EXPECT_EQ(job.model.family, model_family::gpt2);
  EXPECT_EQ(job.model.kv_heads(), 2);
  EXPECT_EQ(job.model.norm_eps, 1e-5);
  EXPECT_FALSE(job.model.tie_embeddings);
  // llama: SwiGLU's width 8 d / 3 rounded up to 64; rotary base 10000.
  auto llama = minimal;
  llama.replace(llama.find("n_head = 2"), 10, "n_head = 2\nfamily = \"llama\"");
  job_config l = parse_job(llama, "<string>");
  EXPECT_EQ(l.model.family, model_family::llama);
  EXPECT_EQ(l.model.d_ff, 64);
  EXPECT_EQ(l.model.kv_heads(), 2);
  EXPECT_EQ(l.model.rope_theta, 10000.0);
  llama.replace(llama.find("n_layer = 1"), 11,
                "n_layer = 1\ntie_embeddings = true");
  EXPECT_TRUE(parse_job(llama, "<string>").model.tie_embeddings);
  EXPECT_EQ(job.data.source, source_kind::markov);
  EXPECT_EQ(job.train.steps, t.steps);
  EXPECT_EQ(job.train.steps, 100);
  EXPECT_EQ(job.train.micro_batch, 1);
  EXPECT_DOUBLE_EQ(job.train.lr, 1e-3);
  EXPECT_DOUBLE_EQ(job.train.min_lr, 1e-4);
  EXPECT_EQ(job.train.warmup_steps, 0);
  EXPECT_EQ(job.train.decay_steps, 0);
  EXPECT_DOUBLE_EQ(job.train.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(job.train.beta1, 0.9);
  EXPECT_DOUBLE_EQ(job.train.beta2, 0.95);
  EXPECT_DOUBLE_EQ(job.train.eps, 1e-8);
  EXPECT_DOUBLE_EQ(job.train.grad_clip, 1.0);
  EXPECT_EQ(job.train.eval_every, 0);
  EXPECT_EQ(job.train.eval_batches, 1);
  EXPECT_EQ(job.train.threads_per_chip, 1);
  EXPECT_EQ(job.emulation.clock, clock_mode::virtual_clock);
  EXPECT_EQ(job.emulation.memory_scale, 1.0);
  EXPECT_EQ(job.emulation.time_scale, 1.0);
  EXPECT_EQ(job.plan.mode, plan_mode::even);
  EXPECT_EQ(job.plan.schedule, schedule_kind::one_f_one_b);
  EXPECT_EQ(job.plan.stages.size(), 3u);
  EXPECT_EQ(job.plan.recompute, std::vector<recompute_policy>(3));
  EXPECT_EQ(job.metrics.port, 0);
  EXPECT_EQ(job.metrics.bind, "127.0.0.1");
  EXPECT_EQ(job.transport.timeout_seconds, 60);
  EXPECT_EQ(job.transport.shm_ring_bytes, std::uint64_t{16} << 20);
  EXPECT_EQ(job.transport.shm_heap_bytes, std::uint64_t{256} << 20);
  EXPECT_EQ(job.transport.rdma_ring_bytes, std::uint64_t{16} << 20);
  EXPECT_NE(job.profiles.find("h100-sxm"), nullptr);

  auto chips = job.chips();
  ASSERT_EQ(chips.size(), 3u);
  EXPECT_EQ(chips[0]->backend, device_backend::cpu);
  EXPECT_EQ(chips[0]->compute_dtype, dtype::fp32);
  EXPECT_EQ(chips[0]->profile.name, "cpu");
  EXPECT_GT(chips[0]->profile.memory_bytes, 0u);
  EXPECT_EQ(chips[1]->compute_dtype, dtype::bf16);
  // No bf16 on a V100: the default falls back to fp32.
  EXPECT_EQ(chips[2]->compute_dtype, dtype::fp32);
}

TEST(core_job, schedules_by_name_and_auto) {
  for (auto kind : {schedule_kind::gpipe, schedule_kind::one_f_one_b,
                    schedule_kind::zb_h1}) {
    auto job = parse_job(
      edit(base_job, {{"mode = \"even\"", "mode = \"even\"\nschedule = \"" +
                                              std::string(to_string(kind)) +
                                              "\""}}),
      "t");
    EXPECT_EQ(job.plan.schedule, kind);
    EXPECT_FALSE(job.plan.search_schedule);
  }
  auto job = parse_job(
    edit(base_job,
         {{"mode = \"even\"", "mode = \"auto\"\nschedule = \"auto\""}}),
    "t");
  EXPECT_TRUE(job.plan.search_schedule);
}

TEST(core_job, transport_section) {
  job_config job = parse_job(base_job + "\n[transport]\nshm_ring_mb = 0.5\n"
                                        "shm_heap_mb = 0\ncrc = true\n",
                             "<string>");
  EXPECT_EQ(job.transport.shm_ring_bytes, std::uint64_t{512} << 10);
  EXPECT_EQ(job.transport.shm_heap_bytes, 0u); // every payload streams
  EXPECT_TRUE(job.transport.crc);
  EXPECT_TRUE(job.transport.cuda_ipc); // the default
  EXPECT_FALSE(
    parse_job(base_job + "\n[transport]\ncuda_ipc = false\n", "<string>")
      .transport.cuda_ipc);
  // The rdma ring has its own key; the shm ring does not move it.
  EXPECT_EQ(job.transport.rdma_ring_bytes, std::uint64_t{16} << 20);
}

TEST(core_job, rdma_ring_has_its_own_key) {
  job_config job = parse_job(
    base_job + "\n[transport]\nrdma_ring_mb = 0.25\n", "<string>");
  EXPECT_EQ(job.transport.rdma_ring_bytes, std::uint64_t{256} << 10);
  EXPECT_EQ(job.transport.shm_ring_bytes, std::uint64_t{16} << 20);
}

TEST(core_job, runtime_section) {
  EXPECT_EQ(parse_job(base_job, "<string>").runtime.step_timeout_seconds,
            600);
  job_config job = parse_job(
    base_job + "\n[runtime]\nstep_timeout_seconds = 2.5\n", "<string>");
  EXPECT_EQ(job.runtime.step_timeout_seconds, 2.5);
}

TEST(core_job, ditorch_section) {
  EXPECT_FALSE(parse_job(base_job, "<string>").ditorch.check);
  EXPECT_TRUE(parse_job(base_job + "\n[ditorch]\ncheck = true\n", "<string>")
                .ditorch.check);
}

TEST(core_job, cluster_section) {
  EXPECT_EQ(parse_job(base_job, "<string>").cluster.join_timeout_seconds, 300);
  job_config job = parse_job(
    base_job + "\n[cluster]\njoin_timeout_seconds = 2.5\n", "<string>");
  EXPECT_EQ(job.cluster.join_timeout_seconds, 2.5);
}

TEST(core_job, checkpoint_section) {
  EXPECT_TRUE(parse_job(base_job, "<string>").checkpoint.dir.empty());
  job_config job = parse_job(
    base_job + "\n[checkpoint]\ndir = \"ckpt\"\nevery = 50\nkeep = 2\n",
    "<string>");
  EXPECT_EQ(job.checkpoint.dir, "ckpt");
  EXPECT_EQ(job.checkpoint.every, 50);
  EXPECT_EQ(job.checkpoint.keep, 2);
  EXPECT_EQ(parse_job(base_job + "\n[checkpoint]\ndir = \"c\"\n", "<string>")
              .checkpoint.keep,
            3);
}

TEST(core_job, min_lr_default_never_exceeds_lr) {
  auto job = parse_job(
    edit(base_job, {{"micro_batch = 2", "micro_batch = 2\nlr = 5e-5"}}), "t");
  EXPECT_DOUBLE_EQ(job.train.lr, 5e-5);
  EXPECT_DOUBLE_EQ(job.train.min_lr, 5e-5);
}

TEST(core_job, manual_plan_and_chip_tables) {
  auto job = parse_job(
    edit(base_job,
         {{"chips = [\"emulated:h100-sxm\", \"emulated:a100-sxm-40gb\"]",
           "chips = [{ device = \"emulated:h100-sxm\", dtype = \"fp32\" }, "
           "\"emulated:a100-sxm-40gb\"]\n[[nodes]]\nchips = [\"cpu\"]"},
          {"mode = \"even\"",
           "mode = \"manual\"\nschedule = \"gpipe\"\nstages = [\"1:0\", "
           "\"0:1\", \"0:0\"]\nlayers = [1, 2, 1]\nrecompute = [false, "
           "\"1 block + attention\", true]\nzero1 = true"}}),
    "t");
  EXPECT_TRUE(job.plan.zero1);
  EXPECT_FALSE(parse_job(base_job, "t").plan.zero1);
  EXPECT_EQ(job.nodes.size(), 2u);
  EXPECT_EQ(job.nodes[1].rank, 1);
  EXPECT_EQ(job.nodes[1].chips[0].id, (chip_id{1, 0}));
  EXPECT_EQ(job.find_chip({0, 0})->compute_dtype, dtype::fp32);
  EXPECT_EQ(job.plan.mode, plan_mode::manual);
  EXPECT_EQ(job.plan.schedule, schedule_kind::gpipe);
  EXPECT_EQ(job.plan.stages, (std::vector<chip_id>{{1, 0}, {0, 1}, {0, 0}}));
  EXPECT_EQ(job.plan.layers, (std::vector<int>{1, 2, 1}));
  EXPECT_EQ(job.plan.recompute,
            (std::vector<recompute_policy>{recompute_policy::none(),
                                           {false, 1, true},
                                           recompute_policy::whole()}));
}

// `repeat` declares identical nodes at once, numbered on in order.
TEST(core_job, nodes_repeat) {
  const std::string text = tiny_model + R"(
[[nodes]]
chips = ["emulated:h100-sxm"]
[[nodes]]
repeat = 3
chips = ["emulated:mi250x", "emulated:mi250x"]
[[nodes]]
chips = ["emulated:a100-sxm-80gb"]
[plan]
mode = "auto"
)";
  auto job = parse_job(text, "t");
  ASSERT_EQ(job.nodes.size(), 5u);
  EXPECT_EQ(job.chips().size(), 8u);
  for (int n = 0; n < 5; ++n) {
    EXPECT_EQ(job.nodes[static_cast<std::size_t>(n)].rank, n);
    for (const auto& c : job.nodes[static_cast<std::size_t>(n)].chips)
      EXPECT_EQ(c.id.node, n);
  }
  EXPECT_EQ(job.find_chip({3, 1})->profile.name, "mi250x");
  EXPECT_EQ(job.find_chip({4, 0})->profile.name, "a100-sxm-80gb");
  EXPECT_EQ(job.find_chip({4, 1}), nullptr);
  for (const char* bad : {"repeat = 0", "repeat = -2", "repeat = 2000000"}) {
    auto t = text;
    t.replace(t.find("repeat = 3"), 10, bad);
    expect_config_error([&] { parse_job(t, "t"); }, "nodes[1].repeat",
                        {"expected an integer from 1"});
  }
}

TEST(core_job, emulation_section) {
  auto job = parse_job(
    base_job + "\n[emulation]\nclock = \"wall\"\nmemory_scale = 0.5\n"
               "time_scale = 4\nlink_bandwidth_bytes_per_second = inf\n"
               "link_latency_seconds = 0.001\n",
    "t");
  EXPECT_EQ(job.emulation.clock, clock_mode::wall);
  EXPECT_EQ(job.emulation.memory_scale, 0.5);
  EXPECT_EQ(job.emulation.time_scale, 4);
  ASSERT_TRUE(job.emulation.link_bandwidth_bytes_per_second.has_value());
  EXPECT_TRUE(std::isinf(*job.emulation.link_bandwidth_bytes_per_second));
  ASSERT_TRUE(job.emulation.link_latency_seconds.has_value());
  EXPECT_EQ(*job.emulation.link_latency_seconds, 0.001);
}

TEST(core_job, rebalance_drills_noise_and_admin) {
  const job_config plain = parse_job(base_job, "t");
  EXPECT_EQ(plain.rebalance.policy, rebalance_mode::off);
  EXPECT_EQ(plain.rebalance.window, 3);
  EXPECT_EQ(plain.rebalance.min_interval, 10);
  EXPECT_TRUE(plain.drills.empty());
  EXPECT_EQ(plain.emulation.noise, 0);
  EXPECT_EQ(plain.admin.port, 0);
  EXPECT_EQ(plain.admin.bind, "127.0.0.1");
  auto job = parse_job(base_job + R"(
[emulation]
noise = 0.1
noise_seed = 5
[rebalance]
policy = "auto"
threshold = 0.1
window = 4
min_interval = 0
[[drills]]
step = 150
restore = "0:1"
[[drills]]
step = 100
throttle = "0:1"
factor = 2.5
[admin]
port = 9500
token_file = "admin.token"
page = "token"
)",
                       "t");
  EXPECT_EQ(job.emulation.noise, 0.1);
  EXPECT_EQ(job.emulation.noise_seed, 5u);
  EXPECT_EQ(job.rebalance.policy, rebalance_mode::automatic);
  EXPECT_EQ(job.rebalance.threshold, 0.1);
  EXPECT_EQ(job.rebalance.window, 4);
  EXPECT_EQ(job.rebalance.min_interval, 0);
  ASSERT_EQ(job.drills.size(), 2u); // in step order
  EXPECT_EQ(job.drills[0].step, 100);
  EXPECT_EQ(job.drills[0].chip, (chip_id{0, 1}));
  EXPECT_EQ(job.drills[0].factor, 2.5);
  EXPECT_EQ(job.drills[1].step, 150);
  EXPECT_EQ(job.drills[1].factor, 1);
  EXPECT_EQ(job.admin.port, 9500);
  EXPECT_EQ(job.admin.token_file, "admin.token");
  EXPECT_EQ(job.admin.page, "token"); // on 127.0.0.1: allowed without TLS
  EXPECT_EQ(plain.admin.page, "open");
}

TEST(core_job, custom_profile_is_used_by_a_chip) {
  auto job = parse_job(
    edit(base_job, {{"\"emulated:a100-sxm-40gb\"", "\"emulated:acme-x1\""}}) +
      R"(
[profiles.acme-x1]
vendor = "Acme"
model = "Acme X1"
peak_tflops = { fp32 = 10, bf16 = 40, fp16 = 0 }
memory_gib = 16
memory_bandwidth_gb_per_s = 1000
interconnect_gb_per_s = 50
source = "https://example.com/x1"
)",
    "t");
  const chip_spec* c = job.find_chip({0, 1});
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->device, "emulated:acme-x1");
  EXPECT_EQ(c->backend, device_backend::emulated);
  EXPECT_EQ(c->profile.name, "acme-x1");
  EXPECT_EQ(c->profile.vendor, "Acme");
  EXPECT_EQ(c->profile.memory_bytes, 16ull << 30);
  EXPECT_DOUBLE_EQ(c->profile.peak_flops(dtype::bf16), 40e12);
  EXPECT_EQ(c->compute_dtype, dtype::bf16);
  ASSERT_NE(job.profiles.find("acme-x1"), nullptr);
  ASSERT_NE(job.profiles.find("h100-sxm"), nullptr);      // built-ins kept
  EXPECT_EQ(catalog::builtin().find("acme-x1"), nullptr); // not leaked
}

/// One wrong job: how it is made from the base, and what must be reported.
struct bad_job {
  std::string name;
  edits changes;
  std::string appended; ///< text added at the end
  std::string key_path;
  std::vector<std::string> needles;
};

void PrintTo(const bad_job& b, std::ostream* os) {
  *os << b.name;
}

class core_job_rejects : public ::testing::TestWithParam<bad_job> {};

TEST_P(core_job_rejects, with_key_path_and_reason) {
  const bad_job& b = GetParam();
  std::string text = edit(base_job, b.changes) + b.appended;
  try {
    parse_job(text, "bad.toml");
    ADD_FAILURE() << "accepted:\n" << text;
  } catch (const config_error& e) {
    EXPECT_EQ(e.key_path(), b.key_path) << "message: " << e.what();
    std::string what = e.what();
    for (const auto& needle : b.needles)
      EXPECT_NE(what.find(needle), std::string::npos)
        << "message: " << what << "\nexpected to contain: " << needle;
  }
}

const std::string model_section = R"([model]
vocab_size = 33
seq_len = 16
d_model = 32
n_head = 4
n_layer = 2
)";
const std::string chips_line =
  "chips = [\"emulated:h100-sxm\", \"emulated:a100-sxm-40gb\"]";

const std::string acme_profile = R"(
[profiles.acme-x1]
vendor = "Acme"
peak_tflops = { fp32 = 10, bf16 = 40, fp16 = 0 }
memory_gib = 16
memory_bandwidth_gb_per_s = 1000
interconnect_gb_per_s = 50
)";

const bad_job bad_jobs[] = {
  {"missing_model",
   {{model_section, ""}},
   "",
   "model",
   {"missing required table [model]"}},
  {"missing_d_model",
   {{"d_model = 32\n", ""}},
   "",
   "model.d_model",
   {"missing required key"}},
  {"string_for_int",
   {{"n_layer = 2", "n_layer = \"2\""}},
   "",
   "model.n_layer",
   {"expected an integer, got a string"}},
  {"float_for_int",
   {{"seq_len = 16", "seq_len = 16.5"}},
   "",
   "model.seq_len",
   {"expected an integer, got a float"}},
  {"zero_layers",
   {{"n_layer = 2", "n_layer = 0"}},
   "",
   "model.n_layer",
   {">= 1", "got 0"}},
  {"d_model_whose_default_d_ff_overflows",
   {{"d_model = 32", "d_model = 536870912"}},
   "",
   "model.d_model",
   {"<= 65536", "got 536870912"}},
  {"vocab_size_over_the_bound",
   {{"vocab_size = 33", "vocab_size = 4294967296"}},
   "",
   "model.vocab_size",
   {"<= 16777216"}},
  {"n_layer_over_the_bound",
   {{"n_layer = 2", "n_layer = 1073741824"}},
   "",
   "model.n_layer",
   {"<= 8192"}},
  {"global_batch_over_the_bound",
   {{"global_batch = 8", "global_batch = 1073741824"}},
   "",
   "train.global_batch",
   {"<= 1048576"}},
  {"micro_batch_whose_tensors_overflow",
   {{"seq_len = 16", "seq_len = 1048576"}},
   "",
   "train.micro_batch",
   {"a micro-batch of 2 sequences of 1048576 tokens", "over 2^40"}},
  {"n_head_not_dividing",
   {{"n_head = 4", "n_head = 5"}},
   "",
   "model.n_head",
   {"5 does not divide", "d_model = 32"}},
  {"unknown_family",
   {{"n_head = 4", "n_head = 4\nfamily = \"gpt3\""}},
   "",
   "model.family",
   {"\"gpt2\", \"llama\""}},
  {"n_kv_head_of_gpt2",
   {{"n_head = 4", "n_head = 4\nn_kv_head = 2"}},
   "",
   "model.n_kv_head",
   {"only for family = \"llama\""}},
  {"rope_theta_of_gpt2",
   {{"n_head = 4", "n_head = 4\nrope_theta = 1e4"}},
   "",
   "model.rope_theta",
   {"only for family = \"llama\""}},
  {"n_kv_head_not_dividing",
   {{"n_head = 4", "n_head = 4\nfamily = \"llama\"\nn_kv_head = 3"}},
   "",
   "model.n_kv_head",
   {"3 does not divide model.n_head = 4"}},
  {"odd_rotary_head",
   {{"n_head = 4", "n_head = 32\nfamily = \"llama\""}},
   "",
   "model.n_head",
   {"even head width", "= 1"}},
  {"unknown_profile",
   {{"\"emulated:a100-sxm-40gb\"", "\"emulated:nope\""}},
   "",
   "nodes[0].chips[1]",
   {"unknown chip profile 'nope'", "h100-sxm"}},
  {"unknown_profile_in_table",
   {{"\"emulated:h100-sxm\"", "{ device = \"emulated:nope\" }"}},
   "",
   "nodes[0].chips[0].device",
   {"unknown chip profile 'nope'"}},
  {"unknown_device",
   {{"\"emulated:a100-sxm-40gb\"", "\"tpu:0\""}},
   "",
   "nodes[0].chips[1]",
   {"unknown device \"tpu:0\""}},
  {"signed_cuda_index",
   {{"\"emulated:a100-sxm-40gb\"", "\"cuda:+1\""}},
   "",
   "nodes[0].chips[1]",
   {"cuda:<device index>", "cuda:+1"}},
  {"missing_nodes",
   {{"[[nodes]]\n" + chips_line + "\n", ""}},
   "",
   "nodes",
   {"at least one [[nodes]]"}},
  {"empty_chips",
   {{chips_line, "chips = []"}},
   "",
   "nodes[0].chips",
   {"missing"}},
  {"unknown_key_in_node",
   {{chips_line, chips_line + "\ncheeps = 1"}},
   "",
   "nodes[0].cheeps",
   {"unknown key", "did you mean 'chips'"}},
  {"manual_layers_wrong_sum",
   {{"mode = \"even\"", "mode = \"manual\"\nlayers = [1, 2]"}},
   "",
   "plan.layers",
   {"sums to 3", "has 4 layers"}},
  {"manual_layers_missing",
   {{"mode = \"even\"", "mode = \"manual\""}},
   "",
   "plan.layers",
   {"missing"}},
  {"manual_layers_wrong_count",
   {{"mode = \"even\"", "mode = \"manual\"\nlayers = [1, 1, 2]"}},
   "",
   "plan.layers",
   {"has 3 entries", "2 stages"}},
  {"manual_layer_zero",
   {{"mode = \"even\"", "mode = \"manual\"\nlayers = [0, 4]"}},
   "",
   "plan.layers[0]",
   {"between 1 and 4", "got 0"}},
  {"layers_without_manual",
   {{"mode = \"even\"", "mode = \"even\"\nlayers = [2, 2]"}},
   "",
   "plan.layers",
   {"only allowed with plan.mode = \"manual\""}},
  {"bad_plan_mode",
   {{"mode = \"even\"", "mode = \"automatic\""}},
   "",
   "plan.mode",
   {"\"even\", \"manual\", \"auto\"", "\"automatic\""}},
  {"bad_schedule",
   {{"mode = \"even\"", "schedule = \"zb\""}},
   "",
   "plan.schedule",
   {"\"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"zb-h1\"", "\"zb\""}},
  {"schedule_auto_needs_auto_mode",
   {{"mode = \"even\"", "mode = \"even\"\nschedule = \"auto\""}},
   "",
   "plan.schedule",
   {"\"auto\" lets the planner choose the schedule: it needs mode = "
    "\"auto\""}},
  {"interleaved_with_one_chunk",
   {{"mode = \"even\"",
     "schedule = \"interleaved-1f1b\"\nchunks_per_chip = 1"}},
   "",
   "plan.chunks_per_chip",
   {"interleaved-1f1b needs at least 2 chunks per chip"}},
  {"chunks_under_1f1b",
   {{"mode = \"even\"", "chunks_per_chip = 2"}},
   "",
   "plan.chunks_per_chip",
   {"1f1b runs one chunk per chip", "\"interleaved-1f1b\""}},
  {"zero1_not_a_boolean",
   {{"mode = \"even\"", "zero1 = \"yes\""}},
   "",
   "plan.zero1",
   {"a boolean"}},
  {"recompute_wrong_count",
   {{"mode = \"even\"", "recompute = [true]"}},
   "",
   "plan.recompute",
   {"has 1 entries", "2 stages"}},
  {"micro_batch_not_dividing",
   {{"micro_batch = 2", "micro_batch = 3"}},
   "",
   "train.micro_batch",
   {"3 does not divide", "global_batch = 8"}},
  {"missing_global_batch",
   {{"global_batch = 8\n", ""}},
   "",
   "train.global_batch",
   {"missing required key"}},
  {"unknown_top_level_key_near",
   {},
   "\n[trian]\nsteps = 1\n",
   "trian",
   {"unknown key", "did you mean 'train'"}},
  {"unknown_top_level_key_far",
   {{"[job]", "banana = 1\n[job]"}},
   "",
   "banana",
   {"unknown key"}},
  {"unknown_train_key_near",
   {{"micro_batch = 2", "micro_batch = 2\nstpes = 10"}},
   "",
   "train.stpes",
   {"unknown key", "did you mean 'steps'"}},
  {"unknown_train_key_far",
   {{"micro_batch = 2", "micro_batch = 2\nzzzzzzzz = 10"}},
   "",
   "train.zzzzzzzz",
   {"unknown key"}},
  {"broken_toml_syntax",
   {{"vocab_size = 33", "vocab_size = = 33"}},
   "",
   "",
   {"bad.toml:6:", "invalid TOML"}},
  {"duplicate_stage_chip",
   {{"mode = \"even\"", "stages = [\"0:0\", \"0:0\"]"}},
   "",
   "plan.stages[1]",
   {"chip 0:0 appears twice"}},
  {"stage_chip_missing",
   {{"mode = \"even\"", "stages = [\"0:0\", \"0:5\"]"}},
   "",
   "plan.stages[1]",
   {"no chip 0:5"}},
  {"stage_chip_malformed",
   {{"mode = \"even\"", "stages = [\"0:0\", \"zero\"]"}},
   "",
   "plan.stages[1]",
   {"\"<node>:<index>\"", "\"zero\""}},
  {"more_stages_than_layers",
   {{chips_line, "chips = [\"cpu\", \"cpu\", \"cpu\", \"cpu\", \"cpu\"]"}},
   "",
   "plan.stages",
   {"5 stages", "only 4 layers"}},
  {"fp16_rejected",
   {{"\"emulated:h100-sxm\"",
     "{ device = \"emulated:h100-sxm\", dtype = \"fp16\" }"}},
   "",
   "nodes[0].chips[0].dtype",
   {"\"fp16\"", "use bf16"}},
  {"unknown_dtype",
   {{"\"emulated:h100-sxm\"",
     "{ device = \"emulated:h100-sxm\", dtype = \"int8\" }"}},
   "",
   "nodes[0].chips[0].dtype",
   {"\"fp32\" or \"bf16\"", "\"int8\""}},
  {"fp32_on_gaudi2",
   {{"\"emulated:h100-sxm\"",
     "{ device = \"emulated:gaudi2\", dtype = \"fp32\" }"}},
   "",
   "nodes[0].chips[0].dtype",
   {"gaudi2", "no published fp32 peak"}},
  {"bf16_on_v100",
   {{"\"emulated:h100-sxm\"",
     "{ device = \"emulated:v100-sxm2-32gb\", dtype = \"bf16\" }"}},
   "",
   "nodes[0].chips[0].dtype",
   {"v100-sxm2-32gb", "no published bf16 peak"}},
  {"markov_entropy_above_ln_states",
   {{"entropy_rate = 1.0", "entropy_rate = 3.5"}},
   "",
   "data.entropy_rate",
   {"3.46574", "3.5"}},
  {"markov_entropy_equal_ln_states",
   {{"entropy_rate = 1.0", "entropy_rate = 3.4657359027997265"}},
   "",
   "data.entropy_rate",
   {"below ln(states)"}},
  {"markov_entropy_zero",
   {{"entropy_rate = 1.0", "entropy_rate = 0"}},
   "",
   "data.entropy_rate",
   {"(0, "}},
  {"markov_entropy_missing",
   {{"entropy_rate = 1.0\n", ""}},
   "",
   "data.entropy_rate",
   {"missing required key"}},
  {"markov_needs_three_ids",
   {{"vocab_size = 33", "vocab_size = 2"}},
   "",
   "model.vocab_size",
   {"vocab_size in [3, 4097]"}},
  {"markov_matrix_too_large",
   {{"vocab_size = 33", "vocab_size = 50257"}},
   "",
   "model.vocab_size",
   {"vocab_size in [3, 4097]", "states x states"}},
  {"tokens_need_train",
   {{"source = \"markov\"\nentropy_rate = 1.0", "source = \"tokens\""}},
   "",
   "data.train",
   {"missing required key"}},
  {"bad_source",
   {{"source = \"markov\"", "source = \"wiki\""}},
   "",
   "data.source",
   {"\"markov\", \"tokens\"", "\"wiki\""}},
  {"bad_clock",
   {},
   "\n[emulation]\nclock = \"sundial\"\n",
   "emulation.clock",
   {"\"virtual\", \"wall\"", "\"sundial\""}},
  {"zero_link_bandwidth",
   {},
   "\n[emulation]\nlink_bandwidth_bytes_per_second = 0\n",
   "emulation.link_bandwidth_bytes_per_second",
   {"positive"}},
  {"beta_of_one",
   {{"micro_batch = 2", "micro_batch = 2\nbeta2 = 1"}},
   "",
   "train.beta2",
   {"below 1"}},
  {"min_lr_above_lr",
   {{"micro_batch = 2", "micro_batch = 2\nlr = 1e-3\nmin_lr = 1e-2"}},
   "",
   "train.min_lr",
   {"[0, 0.001]"}},
  {"metrics_port_too_large",
   {},
   "\n[metrics]\nport = 70000\n",
   "metrics.port",
   {"0-65535"}},
  {"negative_seed",
   {{"seed = 7", "seed = -1"}},
   "",
   "job.seed",
   {"non-negative"}},
  {"profile_bad_peak",
   {},
   edit(acme_profile, {{"bf16 = 40", "bf16 = \"x\""}}),
   "profiles.acme-x1.peak_tflops.bf16",
   {"expected a number"}},
  {"profile_missing_vendor",
   {},
   edit(acme_profile, {{"vendor = \"Acme\"\n", ""}}),
   "profiles.acme-x1.vendor",
   {"missing required key"}},
  {"redefine_builtin_profile",
   {},
   edit(acme_profile, {{"[profiles.acme-x1]", "[profiles.h100-sxm]"}}),
   "profiles.h100-sxm",
   {"'h100-sxm' already exists"}},
  {"zero_shm_ring",
   {},
   "\n[transport]\nshm_ring_mb = 0\n",
   "transport.shm_ring_mb",
   {"(0, 1.04858e+06]", "got 0"}},
  {"tiny_rdma_ring",
   {},
   "\n[transport]\nrdma_ring_mb = 0.01\n",
   "transport.rdma_ring_mb",
   {"[0.0625, 1024]", "got 0.01"}},
  {"huge_rdma_ring",
   {},
   "\n[transport]\nrdma_ring_mb = 2048\n",
   "transport.rdma_ring_mb",
   {"[0.0625, 1024]", "got 2048"}},
  {"negative_shm_heap",
   {},
   "\n[transport]\nshm_heap_mb = -1\n",
   "transport.shm_heap_mb",
   {"[0, 1.04858e+06]", "got -1"}},
  {"zero_step_timeout",
   {},
   "\n[runtime]\nstep_timeout_seconds = 0\n",
   "runtime.step_timeout_seconds",
   {"got 0"}},
  {"step_timeout_not_a_number",
   {},
   "\n[runtime]\nstep_timeout_seconds = \"long\"\n",
   "runtime.step_timeout_seconds",
   {}},
  {"ditorch_check_not_a_bool",
   {},
   "\n[ditorch]\ncheck = \"yes\"\n",
   "ditorch.check",
   {}},
  {"ditorch_unknown_key",
   {},
   "\n[ditorch]\ncheck = true\natol = 1e-3\n",
   "ditorch.atol",
   {}},
  {"unknown_runtime_key",
   {},
   "\n[runtime]\nstep_timeout = 5\n",
   "runtime.step_timeout",
   {"unknown key"}},
  {"zero_join_timeout",
   {},
   "\n[cluster]\njoin_timeout_seconds = 0\n",
   "cluster.join_timeout_seconds",
   {"got 0"}},
  {"negative_join_timeout",
   {},
   "\n[cluster]\njoin_timeout_seconds = -5\n",
   "cluster.join_timeout_seconds",
   {"got -5"}},
  {"unknown_cluster_key",
   {},
   "\n[cluster]\njoin_timeout = 5\n",
   "cluster.join_timeout",
   {"unknown key"}},
  {"checkpoint_without_dir",
   {},
   "\n[checkpoint]\nevery = 5\n",
   "checkpoint.dir",
   {"missing"}},
  {"checkpoint_keep_zero",
   {},
   "\n[checkpoint]\ndir = \"c\"\nkeep = 0\n",
   "checkpoint.keep",
   {"got 0"}},
  {"profile_not_a_table",
   {},
   "\n[profiles]\nacme = 1\n",
   "profiles.acme",
   {"expected a table"}},
  {"rebalance_policy_unknown",
   {},
   "\n[rebalance]\npolicy = \"on\"\n",
   "rebalance.policy",
   {"\"off\", \"auto\"", "\"on\""}},
  {"rebalance_window_zero",
   {},
   "\n[rebalance]\nwindow = 0\n",
   "rebalance.window",
   {"got 0"}},
  {"rebalance_threshold_negative",
   {},
   "\n[rebalance]\nthreshold = -0.1\n",
   "rebalance.threshold",
   {"-0.1"}},
  {"drill_without_chip",
   {},
   "\n[[drills]]\nstep = 5\nfactor = 2\n",
   "drills[0]",
   {"throttle", "restore"}},
  {"drill_on_an_unknown_chip",
   {},
   "\n[[drills]]\nstep = 5\nthrottle = \"3:0\"\nfactor = 2\n",
   "drills[0].throttle",
   {"no chip 3:0"}},
  {"drill_without_factor",
   {},
   "\n[[drills]]\nstep = 5\nthrottle = \"0:1\"\n",
   "drills[0].factor",
   {"missing"}},
  {"drill_factor_zero",
   {},
   "\n[[drills]]\nstep = 5\nthrottle = \"0:1\"\nfactor = 0\n",
   "drills[0].factor",
   {"got 0"}},
  {"drill_negative_step",
   {},
   "\n[[drills]]\nstep = -1\nrestore = \"0:1\"\n",
   "drills[0].step",
   {"got -1"}},
  {"drill_on_a_real_chip",
   {{"chips = [\"emulated:h100-sxm\", \"emulated:a100-sxm-40gb\"]",
     "chips = [\"emulated:h100-sxm\", \"cpu\"]"}},
   "\n[[drills]]\nstep = 1\nthrottle = \"0:1\"\nfactor = 2\n",
   "drills[0].throttle",
   {"not emulated"}},
  {"noise_too_large",
   {},
   "\n[emulation]\nnoise = 1.5\n",
   "emulation.noise",
   {"1.5"}},
  {"tls_certificate_without_key",
   {},
   "\n[security]\ncertificate = \"node.pem\"\nca_file = \"ca.pem\"\n",
   "security.key",
   {"certificate, key and ca_file"}},
  {"admin_port_without_token",
   {},
   "\n[admin]\nport = 9500\n",
   "admin.token_file",
   {"missing"}},
  {"admin_port_out_of_range",
   {},
   "\n[admin]\nport = 70000\ntoken_file = \"t\"\n",
   "admin.port",
   {"70000"}},
  {"admin_certificate_without_key",
   {},
   "\n[admin]\nport = 9500\ntoken_file = \"t\"\ncertificate = \"a.pem\"\n",
   "admin.key",
   {"both the certificate and its"}},
  {"admin_client_ca_without_tls",
   {},
   "\n[admin]\nport = 9500\ntoken_file = \"t\"\nclient_ca = \"ca.pem\"\n",
   "admin.client_ca",
   {"needs TLS"}},
  {"admin_page_unknown",
   {},
   "\n[admin]\nport = 9500\ntoken_file = \"t\"\npage = \"public\"\n",
   "admin.page",
   {"\"open\", \"token\" or \"off\"", "public"}},
  {"admin_page_token_in_clear_text",
   {},
   "\n[admin]\nbind = \"0.0.0.0\"\nport = 9500\ntoken_file = \"t\"\n"
   "page = \"token\"\n",
   "admin.page",
   {"clear text", "certificate and key"}},
};

INSTANTIATE_TEST_SUITE_P(core, core_job_rejects, ::testing::ValuesIn(bad_jobs),
                         [](const ::testing::TestParamInfo<bad_job>& info) {
                           return info.param.name;
                         });

TEST(core_job, syntax_error_names_line_and_column) {
  try {
    parse_job(edit(base_job, {{"vocab_size = 33", "vocab_size = = 33"}}),
              "bad.toml");
    FAIL() << "broken TOML accepted";
  } catch (const config_error& e) {
    EXPECT_EQ(e.key_path(), "");
    // "bad.toml:<line>:<column>: ..." with the line of the broken key.
    EXPECT_TRUE(
      std::regex_search(e.what(), std::regex("^bad\\.toml:6:[0-9]+: ")))
      << e.what();
  }
}

TEST(core_job, unknown_key_far_from_every_known_key_has_no_hint) {
  for (const auto& text :
       {edit(base_job, {{"[job]", "banana = 1\n[job]"}}),
        edit(base_job,
             {{"micro_batch = 2", "micro_batch = 2\nzzzzzzzz = 1"}})}) {
    try {
      parse_job(text, "t");
      ADD_FAILURE() << "accepted:\n" << text;
    } catch (const config_error& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("unknown key"), std::string::npos) << what;
      EXPECT_EQ(what.find("did you mean"), std::string::npos) << what;
    }
  }
}

} // namespace
} // namespace h2
