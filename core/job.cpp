#include "h2/core/job.hpp"

#include "job_readers.hpp"
#include "toml_reader.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace h2 {

extern const char* const demo_job_toml_text; // generated from examples/

std::string_view to_string(clock_mode m) noexcept {
  return m == clock_mode::wall ? "wall" : "virtual";
}

std::string_view to_string(schedule_kind k) noexcept {
  switch (k) {
    case schedule_kind::gpipe:
      return "gpipe";
    case schedule_kind::one_f_one_b:
      return "1f1b";
    case schedule_kind::interleaved_1f1b:
      return "interleaved-1f1b";
    case schedule_kind::zb_h1:
      return "zb-h1";
    case schedule_kind::zb_hetero:
      return "zb-hetero";
  }
  return "unknown";
}

std::optional<schedule_kind> parse_schedule_kind(std::string_view s) noexcept {
  for (auto k : all_schedule_kinds)
    if (s == to_string(k))
      return k;
  return std::nullopt;
}

int default_chunks_per_chip(schedule_kind k) noexcept {
  switch (k) {
    case schedule_kind::gpipe:
    case schedule_kind::one_f_one_b:
    case schedule_kind::zb_h1:
    case schedule_kind::zb_hetero:
      return 1;
    case schedule_kind::interleaved_1f1b:
      return 2;
  }
  return 1;
}

std::string schedule_kind_choices() {
  std::string out;
  for (auto k : all_schedule_kinds)
    out += (out.empty() ? "\"" : ", \"") + std::string(to_string(k)) + "\"";
  return out;
}

std::string_view to_string(device_backend b) noexcept {
  switch (b) {
    case device_backend::cpu:
      return "cpu";
    case device_backend::emulated:
      return "emulated";
    case device_backend::cuda:
      return "cuda";
    case device_backend::hip:
      return "hip";
  }
  return "unknown";
}

std::string_view to_string(plan_mode m) noexcept {
  switch (m) {
    case plan_mode::even:
      return "even";
    case plan_mode::manual:
      return "manual";
    case plan_mode::automatic:
      return "auto";
  }
  return "unknown";
}

std::vector<const chip_spec*> job_config::chips() const {
  std::vector<const chip_spec*> out;
  for (auto& n : nodes)
    for (auto& c : n.chips)
      out.push_back(&c);
  return out;
}

const chip_spec* job_config::find_chip(const chip_id& id) const {
  // Nodes are numbered in order and chips within them (job files, and the
  // planner's sub-clusters): look there first, then anywhere.
  if (id.node >= 0 && static_cast<std::size_t>(id.node) < nodes.size()) {
    const auto& n = nodes[static_cast<std::size_t>(id.node)];
    if (id.index >= 0 && static_cast<std::size_t>(id.index) < n.chips.size() &&
        n.chips[static_cast<std::size_t>(id.index)].id == id)
      return &n.chips[static_cast<std::size_t>(id.index)];
  }
  for (auto& n : nodes)
    for (auto& c : n.chips)
      if (c.id == id)
        return &c;
  return nullptr;
}

namespace {

using detail::enum_value;
using detail::number_in;
using detail::positive_int;
using detail::table_reader;

/// The Markov source keeps a dense states x states matrix (128 MiB here).
constexpr int max_markov_states = 4096;

/// Bounds of the model's and the batch's sizes (docs/job-file.md), far
/// above any model trained today, that keep every size derived from them
/// (parameters, bytes, tokens per step) inside a 64-bit integer, and every
/// default (d_ff = 4 d_model) inside an int.
constexpr int max_vocab_size = 1 << 24;
constexpr int max_seq_len = 1 << 20;
constexpr int max_d_model = 1 << 16;
constexpr int max_n_head = 1 << 12;
constexpr int max_n_layer = 1 << 13;
constexpr int max_d_ff = 1 << 20;
constexpr int max_sequences = 1 << 20; ///< global_batch, micro_batch
/// Elements of one micro-batch's largest activation (the attention scores
/// or the widest of d_model, d_ff and the logits): 2^40 fp32 is 4 TiB.
constexpr double max_activation_elements = 1099511627776.0;

void read_job_section(table_reader& root, job_config& job) {
  auto t = root.maybe_table("job");
  if (!t)
    return;
  job.name = t->optional<std::string>("name", job.name);
  auto seed = t->optional<std::int64_t>("seed", 0);
  if (seed < 0)
    throw config_error(t->path("seed"), "expected a non-negative integer");
  job.seed = static_cast<std::uint64_t>(seed);
  t->finish();
}

void read_model(table_reader& root, job_config& job) {
  auto t = root.required_table("model");
  auto& m = job.model;
  m.family =
    enum_value(t, "family", model_family::gpt2, "\"gpt2\", \"llama\"",
               [](const std::string& s) -> std::optional<model_family> {
                 if (s == "gpt2")
                   return model_family::gpt2;
                 if (s == "llama")
                   return model_family::llama;
                 return std::nullopt;
               });
  const bool llama = m.family == model_family::llama;
  m.vocab_size =
    positive_int(t, "vocab_size", std::nullopt, 2, max_vocab_size);
  m.seq_len = positive_int(t, "seq_len", std::nullopt, 1, max_seq_len);
  m.d_model = positive_int(t, "d_model", std::nullopt, 1, max_d_model);
  m.n_head = positive_int(t, "n_head", std::nullopt, 1, max_n_head);
  m.n_layer = positive_int(t, "n_layer", std::nullopt, 1, max_n_layer);
  m.d_ff = positive_int(t, "d_ff",
                        llama ? default_llama_d_ff(m.d_model) : 4 * m.d_model,
                        1, max_d_ff);
  if (m.d_model % m.n_head != 0)
    throw config_error(t.path("n_head"), std::to_string(m.n_head) +
                                           " does not divide "
                                           "model.d_model = " +
                                           std::to_string(m.d_model));
  m.norm_eps = number_in(t, "norm_eps", m.norm_eps, 0, 1, true);
  for (const char* key : {"n_kv_head", "rope_theta"})
    if (!llama && t.has(key))
      throw config_error(t.path(key), "only for family = \"llama\" (this "
                                      "model is gpt2)");
  m.n_kv_head = positive_int(t, "n_kv_head", m.n_head, 1, max_n_head);
  if (m.n_head % m.n_kv_head != 0)
    throw config_error(
      t.path("n_kv_head"),
      std::to_string(m.n_kv_head) +
        " does not divide model.n_head = " + std::to_string(m.n_head));
  if (llama && m.head_dim() % 2 != 0)
    throw config_error(t.path("n_head"),
                       "rotary embeddings need an even head width "
                       "(d_model / n_head = " +
                         std::to_string(m.head_dim()) + ")");
  m.rope_theta = number_in(t, "rope_theta", m.rope_theta, 1, 1e12);
  m.tie_embeddings = t.optional<bool>("tie_embeddings", false);
  t.finish();
}

void read_data(table_reader& root, job_config& job) {
  auto t = root.required_table("data");
  auto& d = job.data;
  d.source = enum_value(t, "source", source_kind::markov,
                        "\"markov\", \"tokens\", \"shards\"",
                        [](const std::string& s) -> std::optional<source_kind> {
                          if (s == "markov")
                            return source_kind::markov;
                          if (s == "tokens")
                            return source_kind::tokens;
                          if (s == "shards")
                            return source_kind::shards;
                          return std::nullopt;
                        });
  if (d.source == source_kind::markov) {
    // The chain runs over vocab_size - 1 states; the last id is BOS.
    int states = job.model.vocab_size - 1;
    if (states < 2 || states > max_markov_states)
      throw config_error("model.vocab_size",
                         "a Markov source needs vocab_size in [3, " +
                           std::to_string(max_markov_states + 1) +
                           "] (states + BOS; its transition matrix is "
                           "states x states)");
    double max_h = std::log(static_cast<double>(states));
    if (!t.has("entropy_rate"))
      throw config_error(t.path("entropy_rate"),
                         "missing required key (nats per token, in (0, " +
                           std::to_string(max_h) + "))");
    d.entropy_rate = number_in(t, "entropy_rate", 0, 0, max_h, true);
    if (d.entropy_rate >= max_h)
      throw config_error(t.path("entropy_rate"),
                         "must be below ln(states) = " + std::to_string(max_h));
  } else if (d.source == source_kind::shards) {
    d.shards_dir = t.required<std::string>("shards");
    d.val_fraction = number_in(t, "val_fraction", 0.1, 0, 0.5, true);
  } else {
    d.train_path = t.required<std::string>("train");
    d.val_path = t.optional<std::string>("val", "");
    d.val_fraction = number_in(t, "val_fraction", 0.1, 0, 0.5, true);
  }
  t.finish();
}

/// Refuses a micro-batch whose largest activation has more than
/// max_activation_elements elements (computed in double: no overflow).
void check_activation_size(const gpt_config& m, int micro_batch,
                           const std::string& key) {
  const double tokens = static_cast<double>(micro_batch) * m.seq_len;
  const double widest = std::max({m.d_model, m.d_ff, m.vocab_size});
  const double elements =
    std::max(tokens * widest, tokens * m.n_head * m.seq_len);
  if (elements > max_activation_elements) {
    std::ostringstream msg;
    msg << "a micro-batch of " << micro_batch << " sequences of "
        << m.seq_len << " tokens makes tensors of " << elements
        << " elements (over 2^40)";
    throw config_error(key, msg.str());
  }
}

void read_train(table_reader& root, job_config& job) {
  auto t = root.required_table("train");
  auto& tr = job.train;
  tr.steps = positive_int(t, "steps", tr.steps);
  tr.global_batch =
    positive_int(t, "global_batch", std::nullopt, 1, max_sequences);
  tr.micro_batch = positive_int(t, "micro_batch", 1, 1, max_sequences);
  if (tr.global_batch % tr.micro_batch != 0)
    throw config_error(t.path("micro_batch"),
                       std::to_string(tr.micro_batch) +
                         " does not divide train.global_batch = " +
                         std::to_string(tr.global_batch));
  check_activation_size(job.model, tr.micro_batch, t.path("micro_batch"));
  tr.lr = number_in(t, "lr", tr.lr, 0, 10, true);
  tr.min_lr = number_in(t, "min_lr", std::min(tr.min_lr, tr.lr), 0, tr.lr);
  tr.warmup_steps = positive_int(t, "warmup_steps", 0, 0);
  tr.decay_steps = positive_int(t, "decay_steps", 0, 0);
  tr.weight_decay = number_in(t, "weight_decay", tr.weight_decay, 0, 10);
  tr.beta1 = number_in(t, "beta1", tr.beta1, 0, 1);
  tr.beta2 = number_in(t, "beta2", tr.beta2, 0, 1);
  if (tr.beta1 >= 1 || tr.beta2 >= 1)
    throw config_error(t.path(tr.beta1 >= 1 ? "beta1" : "beta2"),
                       "expected a number below 1");
  tr.eps = number_in(t, "eps", tr.eps, 0, 1, true);
  tr.grad_clip = number_in(t, "grad_clip", tr.grad_clip, 0, 1e9);
  tr.eval_every = positive_int(t, "eval_every", 0, 0);
  tr.eval_batches = positive_int(t, "eval_batches", 1);
  tr.threads_per_chip = positive_int(t, "threads_per_chip", 1);
  t.finish();
}

void read_emulation(table_reader& root, job_config& job) {
  auto t = root.maybe_table("emulation");
  if (!t)
    return;
  auto& e = job.emulation;
  e.clock = enum_value(*t, "clock", e.clock, "\"virtual\", \"wall\"",
                       [](const std::string& s) -> std::optional<clock_mode> {
                         if (s == "virtual")
                           return clock_mode::virtual_clock;
                         if (s == "wall")
                           return clock_mode::wall;
                         return std::nullopt;
                       });
  e.memory_scale = number_in(*t, "memory_scale", 1.0, 0, 1e6, true);
  e.time_scale = number_in(*t, "time_scale", 1.0, 0, 1e9, true);
  e.overhead_scale = number_in(*t, "overhead_scale", 1.0, 0, 1e6);
  if (t->has("link_bandwidth_bytes_per_second")) {
    double v = t->required<double>("link_bandwidth_bytes_per_second");
    if (!(v > 0)) // inf is allowed: transfers then cost only the latency
      throw config_error(t->path("link_bandwidth_bytes_per_second"),
                         "expected a positive number (inf allowed)");
    e.link_bandwidth_bytes_per_second = v;
  }
  if (t->has("link_latency_seconds"))
    e.link_latency_seconds = number_in(*t, "link_latency_seconds", 0, 0, 10);
  e.noise = number_in(*t, "noise", 0, 0, 0.9);
  auto seed = t->optional<std::int64_t>("noise_seed", 0);
  if (seed < 0)
    throw config_error(t->path("noise_seed"),
                       "expected a non-negative integer");
  e.noise_seed = static_cast<std::uint64_t>(seed);
  t->finish();
}

void read_metrics(table_reader& root, job_config& job) {
  auto t = root.maybe_table("metrics");
  if (!t)
    return;
  job.metrics.port = positive_int(*t, "port", 0, 0);
  if (job.metrics.port > 65535)
    throw config_error(t->path("port"), "expected a TCP port (0-65535)");
  job.metrics.bind = t->optional<std::string>("bind", job.metrics.bind);
  t->finish();
}

void read_transport(table_reader& root, job_config& job) {
  auto t = root.maybe_table("transport");
  if (!t)
    return;
  auto& tr = job.transport;
  tr.timeout_seconds = number_in(*t, "timeout_seconds", 60, 0, 86400, true);
  tr.backend = enum_value(*t, "backend", tr.backend,
                          "\"auto\", \"shm\", \"tcp\", \"rdma\"",
                          [](const std::string& s) -> std::optional<std::string> {
                            if (s == "auto" || s == "shm" || s == "tcp" ||
                                s == "rdma")
                              return s;
                            return std::nullopt;
                          });
  tr.crc = t->optional<bool>("crc", tr.crc);
  tr.cuda_ipc = t->optional<bool>("cuda_ipc", tr.cuda_ipc);
  tr.shm_ring_bytes = static_cast<std::uint64_t>(
    number_in(*t, "shm_ring_mb", 16, 0, 1 << 20, true) * (1 << 20));
  tr.shm_heap_bytes = static_cast<std::uint64_t>(
    number_in(*t, "shm_heap_mb", 256, 0, 1 << 20) * (1 << 20));
  // 64 KiB to 1 GiB: the rdma backend's credits are 32-bit immediates.
  tr.rdma_ring_bytes = static_cast<std::uint64_t>(
    number_in(*t, "rdma_ring_mb", 16, 1.0 / 16, 1024) * (1 << 20));
  tr.bucket_bytes = static_cast<std::uint64_t>(
    number_in(*t, "bucket_mb", 25, 0, 1 << 20, true) * (1 << 20));
  tr.reduce_dtype = enum_value(*t, "reduce_dtype", tr.reduce_dtype,
                               "\"fp32\", \"bf16\"",
                               [](const std::string& s) -> std::optional<dtype> {
                                 if (s == "fp32")
                                   return dtype::fp32;
                                 if (s == "bf16")
                                   return dtype::bf16;
                                 return std::nullopt;
                               });
  t->finish();
}

void read_runtime(table_reader& root, job_config& job) {
  auto t = root.maybe_table("runtime");
  if (!t)
    return;
  job.runtime.step_timeout_seconds =
    number_in(*t, "step_timeout_seconds", job.runtime.step_timeout_seconds, 0,
              7 * 86400, true);
  t->finish();
}

void read_watchdog(table_reader& root, job_config& job) {
  auto t = root.maybe_table("watchdog");
  if (!t)
    return;
  auto& w = job.watchdog;
  w.factor = number_in(*t, "factor", w.factor, 0, 1e6);
  w.floor_seconds =
    number_in(*t, "floor_seconds", w.floor_seconds, 0, 7 * 86400, true);
  t->finish();
}

void read_ditorch(table_reader& root, job_config& job) {
  auto t = root.maybe_table("ditorch");
  if (!t)
    return;
  job.ditorch.check = t->optional<bool>("check", job.ditorch.check);
  job.ditorch.cpu_bf16_path =
    enum_value(*t, "cpu_bf16", job.ditorch.cpu_bf16_path,
               "\"auto\", \"native\", \"fp32-accumulate\"",
               [](const std::string& s) { return parse_cpu_bf16(s); });
  for (auto& node : job.nodes)
    for (auto& chip : node.chips)
      chip.bf16_path = job.ditorch.cpu_bf16_path;
  t->finish();
}

void read_checkpoint(table_reader& root, job_config& job) {
  auto t = root.maybe_table("checkpoint");
  if (!t)
    return;
  auto& c = job.checkpoint;
  c.dir = t->required<std::string>("dir");
  if (c.dir.empty())
    throw config_error(t->path("dir"), "expected a directory, got \"\"");
  c.every = positive_int(*t, "every", 0, 0);
  c.keep = positive_int(*t, "keep", c.keep);
  t->finish();
}

void read_restart(table_reader& root, job_config& job) {
  auto t = root.maybe_table("restart");
  if (!t)
    return;
  job.restart.max = positive_int(*t, "max", 0, 0);
  if (job.restart.max > 0 && job.checkpoint.dir.empty())
    throw config_error(t->path("max"),
                       "a restart resumes from the last checkpoint: set "
                       "[checkpoint] dir too");
  t->finish();
}

void read_cluster(table_reader& root, job_config& job) {
  auto t = root.maybe_table("cluster");
  if (!t)
    return;
  job.cluster.join_timeout_seconds =
    number_in(*t, "join_timeout_seconds", job.cluster.join_timeout_seconds, 0,
              7 * 86400, true);
  t->finish();
}

void read_security(table_reader& root, job_config& job) {
  auto t = root.maybe_table("security");
  if (!t)
    return;
  auto& sec = job.security;
  sec.secret_file = t->optional<std::string>("secret_file", "");
  sec.certificate = t->optional<std::string>("certificate", "");
  sec.key = t->optional<std::string>("key", "");
  sec.ca_file = t->optional<std::string>("ca_file", "");
  const bool any =
    !sec.certificate.empty() || !sec.key.empty() || !sec.ca_file.empty();
  for (const auto& [name, value] : {std::pair<const char*, const std::string*>{
                                      "certificate", &sec.certificate},
                                    {"key", &sec.key},
                                    {"ca_file", &sec.ca_file}})
    if (any && value->empty())
      throw config_error(t->path(name),
                         "missing: TLS needs certificate, key and ca_file "
                         "together (docs/transport.md, TLS)");
  t->finish();
}

void read_rebalance(table_reader& root, job_config& job) {
  auto t = root.maybe_table("rebalance");
  if (!t)
    return;
  auto& r = job.rebalance;
  r.policy =
    enum_value(*t, "policy", r.policy, "\"off\", \"auto\"",
               [](const std::string& s) { return parse_rebalance_mode(s); });
  r.threshold = number_in(*t, "threshold", r.threshold, 0, 10);
  r.window = positive_int(*t, "window", r.window);
  r.min_interval = positive_int(*t, "min_interval", r.min_interval, 0);
  t->finish();
}

void read_drills(table_reader& root, job_config& job) {
  const toml::array* drills = root.maybe_array("drills");
  if (drills == nullptr)
    return;
  int i = 0;
  for (const toml::node& n : *drills) {
    std::string path = "drills[" + std::to_string(i++) + "]";
    if (!n.is_table())
      throw config_error(path, "expected a table ([[drills]])");
    table_reader t(*n.as_table(), path);
    drill d;
    d.step = positive_int(t, "step", std::nullopt, 0);
    const bool throttle = t.has("throttle"), restore = t.has("restore"),
               hang = t.has("hang");
    if (int{throttle} + int{restore} + int{hang} != 1)
      throw config_error(path, "expected one of throttle = \"<chip>\" "
                               "(with factor), restore = \"<chip>\" or "
                               "hang = \"<chip>\"");
    const std::string key =
      throttle ? "throttle" : (restore ? "restore" : "hang");
    const auto text = t.required<std::string>(key);
    auto id = chip_id::parse(text);
    if (!id)
      throw config_error(t.path(key), "expected a chip id \"<node>:<index>\", "
                                      "got \"" +
                                        text + "\"");
    const chip_spec* chip = job.find_chip(*id);
    if (chip == nullptr)
      throw config_error(t.path(key), "no chip " + text + " in [[nodes]]");
    if (!hang && chip->backend != device_backend::emulated)
      throw config_error(t.path(key), "chip " + text + " (" + chip->device +
                                        ") is not emulated: only emulated "
                                        "chips can be throttled");
    d.chip = *id;
    d.hang = hang;
    if (throttle) {
      if (!t.has("factor"))
        throw config_error(t.path("factor"),
                           "missing: how many times slower, e.g. factor = 2");
      d.factor = number_in(t, "factor", 1, 0, 1000, true);
    } else if (t.has("factor")) {
      throw config_error(t.path("factor"),
                         hang ? std::string("a hang takes no factor")
                              : "a restore brings the chip back to factor 1");
    }
    t.finish();
    job.drills.push_back(d);
  }
  std::stable_sort(
    job.drills.begin(), job.drills.end(),
    [](const drill& a, const drill& b) { return a.step < b.step; });
}

void read_admin(table_reader& root, job_config& job) {
  auto t = root.maybe_table("admin");
  if (!t)
    return;
  auto& a = job.admin;
  a.bind = t->optional<std::string>("bind", a.bind);
  a.port = positive_int(*t, "port", 0, 0);
  if (a.port > 65535)
    throw config_error(t->path("port"), "expected a TCP port (0-65535), got " +
                                          std::to_string(a.port));
  a.token_file = t->optional<std::string>("token_file", "");
  if (a.port != 0 && a.token_file.empty())
    throw config_error(t->path("token_file"),
                       "missing: the admin endpoint needs a token file "
                       "(docs/admin.md)");
  a.certificate = t->optional<std::string>("certificate", "");
  a.key = t->optional<std::string>("key", "");
  a.client_ca = t->optional<std::string>("client_ca", "");
  if (a.certificate.empty() != a.key.empty())
    throw config_error(t->path(a.key.empty() ? "key" : "certificate"),
                       "missing: TLS needs both the certificate and its "
                       "private key (PEM files)");
  if (!a.client_ca.empty() && a.certificate.empty())
    throw config_error(t->path("client_ca"),
                       "a client CA needs TLS: set certificate and key too");
  a.page = t->optional<std::string>("page", a.page);
  if (a.page != "open" && a.page != "token" && a.page != "off")
    throw config_error(t->path("page"), "expected \"open\", \"token\" or "
                                        "\"off\", got \"" +
                                          a.page + "\"");
  // The browser sends the token itself: over TLS, or only on this host.
  const bool loopback =
    a.bind == "localhost" || a.bind == "::1" || a.bind.rfind("127.", 0) == 0;
  if (a.page == "token" && a.certificate.empty() && !loopback)
    throw config_error(t->path("page"),
                       "\"token\" on " + a.bind +
                         " would send the admin token in clear text: set "
                         "certificate and key, or bind to 127.0.0.1");
  t->finish();
}

} // namespace

job_config parse_job(std::string_view toml_text, const std::string& origin) {
  toml::table root = detail::parse_toml(toml_text, origin);
  job_config job;
  job.origin = origin;
  table_reader top(root, "");
  // Order matters: profiles before nodes, nodes before the plan.
  detail::read_profiles(top, job);
  read_job_section(top, job);
  read_model(top, job);
  read_data(top, job);
  read_train(top, job);
  read_emulation(top, job);
  detail::read_nodes(top, job);
  detail::read_plan(top, job);
  read_metrics(top, job);
  read_transport(top, job);
  read_runtime(top, job);
  read_watchdog(top, job);
  read_ditorch(top, job);
  read_checkpoint(top, job);
  read_restart(top, job);
  read_cluster(top, job);
  read_security(top, job);
  read_rebalance(top, job);
  read_drills(top, job);
  read_admin(top, job);
  detail::read_topology(top, job);
  top.finish();
  return job;
}

bool is_gpu(const chip_spec& chip) noexcept {
  return chip.backend == device_backend::cuda ||
         chip.backend == device_backend::hip;
}

job_config load_job_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error("", path + ": cannot open job file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_job(text.str(), path);
}

std::string_view to_string(rebalance_mode m) noexcept {
  switch (m) {
    case rebalance_mode::off:
      return "off";
    case rebalance_mode::automatic:
      return "auto";
  }
  return "?";
}

std::string_view to_string(cpu_bf16 m) noexcept {
  switch (m) {
    case cpu_bf16::automatic:
      return "auto";
    case cpu_bf16::native:
      return "native";
    case cpu_bf16::fp32_accumulate:
      return "fp32-accumulate";
  }
  return "?";
}

std::optional<cpu_bf16> parse_cpu_bf16(std::string_view text) noexcept {
  for (auto m : {cpu_bf16::automatic, cpu_bf16::native,
                 cpu_bf16::fp32_accumulate})
    if (text == to_string(m))
      return m;
  return std::nullopt;
}

std::optional<rebalance_mode> parse_rebalance_mode(std::string_view text) {
  if (text == "off")
    return rebalance_mode::off;
  if (text == "auto")
    return rebalance_mode::automatic;
  return std::nullopt;
}

void check_rebalance_config(const rebalance_config& c) {
  if (!(c.threshold >= 0) || !std::isfinite(c.threshold))
    throw config_error("rebalance.threshold", "must be a fraction >= 0, got " +
                                                std::to_string(c.threshold));
  if (c.window < 1)
    throw config_error("rebalance.window",
                       "must be >= 1 step, got " + std::to_string(c.window));
  if (c.min_interval < 0)
    throw config_error("rebalance.min_interval",
                       "must be >= 0 steps, got " +
                         std::to_string(c.min_interval));
  if (!(c.smoothing > 0 && c.smoothing <= 1))
    throw config_error("rebalance.smoothing",
                       "must be in (0, 1], got " + std::to_string(c.smoothing));
}

std::string_view demo_job_toml() noexcept {
  return demo_job_toml_text;
}

} // namespace h2
