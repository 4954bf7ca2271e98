// The job fixtures the test suites (and the multi-node benchmark) share:
// TOML text and core's plain structs, no libtorch and no actors, so every
// module's tests can use them. Suites add their own [plan], [[nodes]] and
// overrides.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/model_config.hpp"
#include "h2/core/plan.hpp"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace h2::test {

/// A GPT shape, in gpt_config's field order.
inline gpt_config gpt_shape(int vocab_size, int seq_len, int d_model,
                            int n_head, int n_layer, int d_ff) {
  gpt_config c;
  c.vocab_size = vocab_size;
  c.seq_len = seq_len;
  c.d_model = d_model;
  c.n_head = n_head;
  c.n_layer = n_layer;
  c.d_ff = d_ff;
  return c;
}

/// [model] of `n_layer` blocks without d_ff (4 x d_model), and [data]: the
/// Markov source of entropy rate 1 nat. The jobs of the unit tests.
inline std::string model_toml(int vocab_size, int seq_len, int d_model,
                              int n_head, int n_layer) {
  return "[model]\nvocab_size = " + std::to_string(vocab_size) +
         "\nseq_len = " + std::to_string(seq_len) +
         "\nd_model = " + std::to_string(d_model) +
         "\nn_head = " + std::to_string(n_head) +
         "\nn_layer = " + std::to_string(n_layer) +
         "\n[data]\nsource = \"markov\"\nentropy_rate = 1.0\n";
}

/// [model] and [data]: a GPT of 4 blocks (6 global layers, vocabulary 17,
/// 8 tokens) over a first-order Markov source of entropy rate 1 bit.
inline const std::string small_model_toml = R"(
[model]
vocab_size = 17
seq_len = 8
d_model = 16
n_head = 2
n_layer = 4
d_ff = 32
[data]
source = "markov"
entropy_rate = 1.0
)";

/// [model] and [data]: small_model_toml's shape in the llama family, with
/// grouped-query attention (4 query heads over 2 key/value heads).
inline const std::string small_llama_model_toml = R"(
[model]
family = "llama"
vocab_size = 17
seq_len = 8
d_model = 16
n_head = 4
n_kv_head = 2
n_layer = 4
d_ff = 24
[data]
source = "markov"
entropy_rate = 1.0
)";

/// small_llama_model_toml with tied embeddings.
inline const std::string small_tied_llama_model_toml =
  small_llama_model_toml.substr(0, small_llama_model_toml.find("[data]")) +
  "tie_embeddings = true\n" +
  small_llama_model_toml.substr(small_llama_model_toml.find("[data]"));

/// [train] of the exactness tests: 3 steps of 8 sequences in micro-batches
/// of 2, warm-up, decay and clipping all in play.
inline const std::string small_train_toml = R"(
[train]
steps = 3
global_batch = 8
micro_batch = 2
lr = 1e-2
min_lr = 1e-3
warmup_steps = 1
grad_clip = 0.5
)";

/// [train] of two steps of 8 sequences in micro-batches of 2, defaults
/// otherwise: for tests of time and memory rather than of learning.
inline const std::string two_step_train_toml = R"(
[train]
steps = 2
global_batch = 8
micro_batch = 2
)";

/// A [job] table with `seed`, the small model and training, and the
/// virtual clock: the start of most exactness jobs.
inline std::string small_job_toml(int seed,
                                  const std::string& model = small_model_toml) {
  return "[job]\nseed = " + std::to_string(seed) + "\n" + model +
         small_train_toml + "[emulation]\nclock = \"virtual\"\n";
}

/// One replica over chips 0:0, 0:1, ... of node 0 holding `layers[i]`
/// layers each, `micro_batches` micro-batches of `micro_batch_size`
/// sequences, no recomputation; checked against `job`.
inline plan one_replica_plan(const job_config& job,
                             const std::vector<int>& layers,
                             int micro_batch_size, int micro_batches) {
  plan p;
  replica_plan r;
  int first = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    r.stages.push_back(stage_plan{chip_id{0, static_cast<int>(i)}, first,
                                  first + layers[i], false});
    first += layers[i];
  }
  r.micro_batch_size = micro_batch_size;
  r.micro_batches = micro_batches;
  p.replicas = {r};
  validate_plan(p, job, "test plan");
  return p;
}

/// The demo's four chips (examples/demo.toml) split over two nodes.
inline const std::string demo_on_two_nodes = R"([[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x"]
[[nodes]]
chips = ["emulated:a100-sxm-40gb", "emulated:a100-sxm-40gb"]
)";

/// The demo's four chips, one node each.
inline const std::string demo_on_four_nodes = R"([[nodes]]
chips = ["emulated:h100-sxm"]
[[nodes]]
chips = ["emulated:mi250x"]
[[nodes]]
chips = ["emulated:a100-sxm-40gb"]
[[nodes]]
chips = ["emulated:a100-sxm-40gb"]
)";

/// examples/demo.toml with its [[nodes]] replaced by `nodes` (empty: as
/// it is). `source_dir`: the repository root. Throws std::runtime_error
/// when the file is missing or lost its [[nodes]] or [plan].
inline std::string demo_job_with_nodes(const std::string& source_dir,
                                       const std::string& nodes) {
  std::ifstream in(source_dir + "/examples/demo.toml");
  if (!in)
    throw std::runtime_error(source_dir + "/examples/demo.toml: unreadable");
  std::stringstream text;
  text << in.rdbuf();
  std::string job = text.str();
  if (nodes.empty())
    return job;
  auto at = job.find("[[nodes]]");
  auto end = job.find("[plan]");
  if (at == std::string::npos || end == std::string::npos)
    throw std::runtime_error("examples/demo.toml lost its [[nodes]] or [plan]");
  return job.substr(0, at) + nodes + "\n" + job.substr(end);
}

} // namespace h2::test
