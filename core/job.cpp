#include "h2/core/job.hpp"

#include "toml_reader.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace h2 {

extern const char* const demo_job_toml_text; // generated from examples/

std::string_view to_string(clock_mode m) noexcept {
  return m == clock_mode::wall ? "wall" : "virtual";
}

std::string_view to_string(schedule_kind k) noexcept {
  return k == schedule_kind::gpipe ? "gpipe" : "1f1b";
}

std::optional<schedule_kind> parse_schedule_kind(std::string_view s) noexcept {
  if (s == "gpipe")
    return schedule_kind::gpipe;
  if (s == "1f1b")
    return schedule_kind::one_f_one_b;
  return std::nullopt;
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
  for (auto& n : nodes)
    for (auto& c : n.chips)
      if (c.id == id)
        return &c;
  return nullptr;
}

chip_profile host_cpu_profile() {
  chip_profile p;
  p.name = "cpu";
  p.vendor = "host";
  p.model = "host CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos)
        p.model = line.substr(std::min(colon + 2, line.size()));
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    std::uint64_t kib = 0;
    meminfo >> kib;
    if (key == "MemTotal:") {
      p.memory_bytes = kib * 1024;
      break;
    }
    meminfo.ignore(1 << 16, '\n');
  }
  p.source = "/proc/cpuinfo and /proc/meminfo of this host";
  return p;
}

namespace {

using detail::table_reader;

/// The Markov source keeps a dense states x states matrix (128 MiB here).
constexpr int max_markov_states = 4096;

int positive_int(table_reader& t, std::string_view key,
                 std::optional<int> fallback = std::nullopt, int min = 1) {
  auto v = t.maybe<std::int64_t>(key);
  if (!v) {
    if (fallback)
      return *fallback;
    throw config_error(t.path(key), "missing required key");
  }
  if (*v < min || *v > (1LL << 30))
    throw config_error(t.path(key),
                       "expected an integer >= " + std::to_string(min) +
                         ", got " + std::to_string(*v));
  return static_cast<int>(*v);
}

double number_in(table_reader& t, std::string_view key, double fallback,
                 double lo, double hi, bool lo_open = false) {
  auto v = t.maybe<double>(key);
  if (!v)
    return fallback;
  bool ok = std::isfinite(*v) && (lo_open ? *v > lo : *v >= lo) && *v <= hi;
  if (!ok) {
    std::ostringstream msg;
    msg << "expected a number in " << (lo_open ? "(" : "[") << lo << ", " << hi
        << "], got " << *v;
    throw config_error(t.path(key), msg.str());
  }
  return *v;
}

template <class Enum, class Parse>
Enum enum_value(table_reader& t, std::string_view key, Enum fallback,
                std::string_view choices, Parse parse) {
  auto v = t.maybe<std::string>(key);
  if (!v)
    return fallback;
  if (auto e = parse(*v))
    return *e;
  throw config_error(t.path(key), "expected one of " + std::string(choices) +
                                    ", got \"" + *v + "\"");
}

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
  m.vocab_size = positive_int(t, "vocab_size", std::nullopt, 2);
  m.seq_len = positive_int(t, "seq_len");
  m.d_model = positive_int(t, "d_model");
  m.n_head = positive_int(t, "n_head");
  m.n_layer = positive_int(t, "n_layer");
  m.d_ff = positive_int(t, "d_ff", 4 * m.d_model);
  if (m.d_model % m.n_head != 0)
    throw config_error(t.path("n_head"), std::to_string(m.n_head) +
                                           " does not divide "
                                           "model.d_model = " +
                                           std::to_string(m.d_model));
  t.finish();
}

void read_data(table_reader& root, job_config& job) {
  auto t = root.required_table("data");
  auto& d = job.data;
  d.source =
    enum_value(t, "source", source_kind::markov, "\"markov\", \"tokens\"",
               [](const std::string& s) -> std::optional<source_kind> {
                 if (s == "markov")
                   return source_kind::markov;
                 if (s == "tokens")
                   return source_kind::tokens;
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
  } else {
    d.train_path = t.required<std::string>("train");
    d.val_path = t.optional<std::string>("val", "");
    d.val_fraction = number_in(t, "val_fraction", 0.1, 0, 0.5, true);
  }
  t.finish();
}

void read_train(table_reader& root, job_config& job) {
  auto t = root.required_table("train");
  auto& tr = job.train;
  tr.steps = positive_int(t, "steps", tr.steps);
  tr.global_batch = positive_int(t, "global_batch");
  tr.micro_batch = positive_int(t, "micro_batch", 1);
  if (tr.global_batch % tr.micro_batch != 0)
    throw config_error(t.path("micro_batch"),
                       std::to_string(tr.micro_batch) +
                         " does not divide train.global_batch = " +
                         std::to_string(tr.global_batch));
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

chip_spec read_chip(const toml::node& node, const std::string& path,
                    const job_config& job) {
  chip_spec c;
  std::optional<std::string> dtype_name;
  std::string dtype_path = path;
  if (auto s = node.value_exact<std::string>()) {
    c.device = *s;
  } else if (node.is_table()) {
    table_reader t(*node.as_table(), path);
    c.device = t.required<std::string>("device");
    dtype_name = t.maybe<std::string>("dtype");
    dtype_path = t.path("dtype");
    t.finish();
    if (!dtype_name)
      dtype_path = path;
  } else {
    throw config_error(path, "expected a device string such as "
                             "\"emulated:h100-sxm\" or a table {device = "
                             "..., dtype = ...}, got " +
                               std::string(detail::toml_type_name(node)));
  }
  std::string where = node.is_table() ? path + ".device" : path;
  c = chip_of_device(c.device, where, job.profiles);
  // Default dtype: bf16 where the chip has a bf16 peak (mixed precision, as
  // LLM training runs), fp32 otherwise and on the host CPU.
  bool emulated = c.backend == device_backend::emulated;
  c.compute_dtype =
    emulated && c.profile.peak_tflops_bf16 > 0 ? dtype::bf16 : dtype::fp32;
  if (dtype_name) {
    auto d = parse_dtype(*dtype_name);
    if (!d || *d == dtype::fp16)
      throw config_error(dtype_path,
                         "expected \"fp32\" or \"bf16\", got \"" + *dtype_name +
                           "\"" +
                           (d ? " (fp16 training needs loss scaling, which "
                                "H2 does not do; use bf16)"
                              : ""));
    c.compute_dtype = *d;
    if (emulated && c.profile.peak_flops(*d) == 0)
      throw config_error(dtype_path, c.profile.name + " (" + c.profile.model +
                                       ") has no published " +
                                       std::string(to_string(*d)) +
                                       " peak; use another dtype");
  }
  return c;
}

void read_nodes(table_reader& root, job_config& job) {
  const toml::array* nodes = root.maybe_array("nodes");
  if (nodes == nullptr || nodes->empty())
    throw config_error("nodes", "missing: declare at least one [[nodes]] "
                                "table with a chips = [...] list");
  int rank = 0;
  for (const toml::node& n : *nodes) {
    std::string path = "nodes[" + std::to_string(rank) + "]";
    if (!n.is_table())
      throw config_error(path, "expected a table ([[nodes]])");
    table_reader t(*n.as_table(), path);
    node_spec node;
    node.rank = rank;
    const toml::array* chips = t.maybe_array("chips");
    if (chips == nullptr || chips->empty())
      throw config_error(t.path("chips"),
                         "missing: list the node's chips, e.g. chips = "
                         "[\"emulated:h100-sxm\"]");
    int index = 0;
    for (const toml::node& c : *chips) {
      auto chip =
        read_chip(c, t.path("chips") + "[" + std::to_string(index) + "]", job);
      chip.id = chip_id{rank, index};
      node.chips.push_back(std::move(chip));
      ++index;
    }
    t.finish();
    job.nodes.push_back(std::move(node));
    ++rank;
  }
}

std::vector<chip_id> read_stage_chips(const toml::array& a,
                                      const std::string& path,
                                      const job_config& job) {
  std::vector<chip_id> out;
  std::set<chip_id> seen;
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::string p = path + "[" + std::to_string(i) + "]";
    auto s = detail::toml_value<std::string>(a[i], p);
    auto id = chip_id::parse(s);
    if (!id)
      throw config_error(p, "expected a chip id \"<node>:<index>\", got \"" +
                              s + "\"");
    if (job.find_chip(*id) == nullptr)
      throw config_error(p, "no chip " + s + " in [[nodes]]");
    if (!seen.insert(*id).second)
      throw config_error(p, "chip " + s + " appears twice");
    out.push_back(*id);
  }
  return out;
}

void read_plan(table_reader& root, job_config& job) {
  auto& p = job.plan;
  toml::table none;
  auto t = root.maybe_table("plan");
  if (!t)
    t.emplace(none, "plan");
  p.mode = enum_value(*t, "mode", p.mode, "\"even\", \"manual\", \"auto\"",
                      [](const std::string& s) -> std::optional<plan_mode> {
                        if (s == "even")
                          return plan_mode::even;
                        if (s == "manual")
                          return plan_mode::manual;
                        if (s == "auto")
                          return plan_mode::automatic;
                        return std::nullopt;
                      });
  p.schedule =
    enum_value(*t, "schedule", p.schedule, "\"gpipe\", \"1f1b\"",
               [](const std::string& s) { return parse_schedule_kind(s); });
  if (const toml::array* a = t->maybe_array("stages")) {
    if (a->empty())
      throw config_error(t->path("stages"), "expected at least one chip id");
    p.stages = read_stage_chips(*a, t->path("stages"), job);
  } else {
    for (auto* c : job.chips())
      p.stages.push_back(c->id);
  }
  const int stages = static_cast<int>(p.stages.size());
  const int layers = job.model.num_layers();
  const toml::array* layer_counts = t->maybe_array("layers");
  if (p.mode == plan_mode::manual) {
    if (layer_counts == nullptr)
      throw config_error(t->path("layers"),
                         "missing: plan.mode = \"manual\" needs the layers "
                         "of every stage");
    if (static_cast<int>(layer_counts->size()) != stages)
      throw config_error(t->path("layers"),
                         "has " + std::to_string(layer_counts->size()) +
                           " entries but the plan has " +
                           std::to_string(stages) + " stages");
    int sum = 0;
    for (std::size_t i = 0; i < layer_counts->size(); ++i) {
      std::string path = t->path("layers") + "[" + std::to_string(i) + "]";
      auto v = detail::toml_value<std::int64_t>((*layer_counts)[i], path);
      if (v < 1 || v > layers)
        throw config_error(path, "a stage needs between 1 and " +
                                   std::to_string(layers) + " layers, got " +
                                   std::to_string(v));
      p.layers.push_back(static_cast<int>(v));
      sum += static_cast<int>(v);
    }
    if (sum != layers)
      throw config_error(t->path("layers"),
                         "sums to " + std::to_string(sum) +
                           " but the model "
                           "has " +
                           std::to_string(layers) + " layers (" +
                           "embedding + " + std::to_string(job.model.n_layer) +
                           " blocks + head)");
  } else {
    if (layer_counts != nullptr)
      throw config_error(t->path("layers"),
                         "only allowed with plan.mode = \"manual\"");
    // auto: plan.stages lists the chips the planner may use; it chooses
    // the pipeline depth itself.
    if (p.mode == plan_mode::even && stages > layers)
      throw config_error(t->path("stages"), std::to_string(stages) +
                                              " stages but the model has "
                                              "only " +
                                              std::to_string(layers) +
                                              " layers");
  }
  if (const toml::array* r = t->maybe_array("recompute")) {
    if (p.mode == plan_mode::automatic)
      throw config_error(t->path("recompute"),
                         "not allowed with plan.mode = \"auto\" (the "
                         "planner decides recomputation per stage)");
    if (static_cast<int>(r->size()) != stages)
      throw config_error(t->path("recompute"),
                         "has " + std::to_string(r->size()) +
                           " entries but the plan has " +
                           std::to_string(stages) + " stages");
    for (std::size_t i = 0; i < r->size(); ++i)
      p.recompute.push_back(detail::toml_value<bool>(
        (*r)[i], t->path("recompute") + "[" + std::to_string(i) + "]"));
  } else {
    p.recompute.assign(stages, false);
  }
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
  t->finish();
}

/// One [topology.<tier>] table: bandwidth_gb_per_s and latency_seconds,
/// both optional (absent: the chips' own figures).
void read_tier(table_reader& topology, std::string_view key,
               tier_figures& out) {
  auto t = topology.maybe_table(key);
  if (!t)
    return;
  if (t->has("bandwidth_gb_per_s")) {
    double v = t->required<double>("bandwidth_gb_per_s");
    if (!(v > 0)) // inf is allowed: transfers then cost only the latency
      throw config_error(t->path("bandwidth_gb_per_s"),
                         "expected a positive number (inf allowed)");
    out.bandwidth_bytes_per_second = v * 1e9;
  }
  if (t->has("latency_seconds"))
    out.latency_seconds = number_in(*t, "latency_seconds", 0, 0, 10);
  t->finish();
}

void read_topology(table_reader& root, job_config& job) {
  auto t = root.maybe_table("topology");
  if (!t)
    return;
  auto& topo = job.topology;
  topo.nodes_per_host = positive_int(*t, "nodes_per_host", 1);
  read_tier(*t, "same_node", topo.same_node);
  read_tier(*t, "same_host", topo.same_host);
  read_tier(*t, "between_hosts", topo.between_hosts);
  read_tier(*t, "between_islands", topo.between_islands);
  t->finish();
}

void read_profiles(table_reader& root, job_config& job) {
  job.profiles = catalog::builtin();
  auto t = root.maybe_table("profiles");
  if (!t)
    return;
  t->mark_all_used();
  for (auto&& [key, node] : t->table()) {
    std::string name(key.str());
    auto pt = t->maybe_table(name);
    job.profiles.add(detail::read_profile(*pt, name), pt->path());
  }
}

} // namespace

job_config parse_job(std::string_view toml_text, const std::string& origin) {
  toml::table root = detail::parse_toml(toml_text, origin);
  job_config job;
  job.origin = origin;
  table_reader top(root, "");
  // Order matters: profiles before nodes, nodes before the plan.
  read_profiles(top, job);
  read_job_section(top, job);
  read_model(top, job);
  read_data(top, job);
  read_train(top, job);
  read_emulation(top, job);
  read_nodes(top, job);
  read_plan(top, job);
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
  read_topology(top, job);
  top.finish();
  return job;
}

bool is_gpu(const chip_spec& chip) noexcept {
  return chip.backend == device_backend::cuda ||
         chip.backend == device_backend::hip;
}

chip_spec chip_of_device(const std::string& device, const std::string& where,
                         const catalog& profiles) {
  chip_spec c;
  c.device = device;
  auto colon = c.device.find(':');
  std::string kind = c.device.substr(0, colon);
  std::string arg =
    colon == std::string::npos ? "" : c.device.substr(colon + 1);
  if (kind == "cpu" && arg.empty()) {
    c.backend = device_backend::cpu;
    c.profile = host_cpu_profile();
  } else if (kind == "emulated") {
    c.backend = device_backend::emulated;
    const chip_profile* p = profiles.find(arg);
    if (p == nullptr) {
      std::string known;
      for (auto& n : profiles.names())
        known += (known.empty() ? "" : ", ") + n;
      throw config_error(where, "unknown chip profile '" + arg +
                                  "' (known: " + known + ")");
    }
    c.profile = *p;
  } else if (kind == "cuda" || kind == "hip") {
    c.backend = kind == "cuda" ? device_backend::cuda : device_backend::hip;
    int index = -1;
    if (!arg.empty() && arg.size() <= 4 &&
        arg.find_first_not_of("0123456789") == std::string::npos)
      index = std::stoi(arg);
    if (index < 0)
      throw config_error(where, "expected " + kind + ":<device index>, got \"" +
                                  c.device + "\"");
    c.device_index = index;
    c.profile.name = c.device;
    c.profile.vendor = kind == "cuda" ? "NVIDIA" : "AMD";
    c.profile.model = c.device;
  } else {
    throw config_error(where, "unknown device \"" + c.device +
                                "\" (expected cpu, emulated:<profile>, "
                                "cuda:<n> or hip:<n>)");
  }
  return c;
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
