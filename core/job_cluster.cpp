// The job file's cluster sections (core/job_readers.hpp) and the chips
// that devices name (docs/job-file.md).
#include "job_readers.hpp"

#include "h2/core/catalog.hpp"

#include <algorithm>
#include <fstream>
#include <set>

namespace h2 {

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

namespace detail {

namespace {

/// One entry of plan.recompute: a boolean (full or none) or a policy's text.
recompute_policy recompute_entry(const toml::node& node,
                                 const std::string& path) {
  if (auto b = node.value_exact<bool>())
    return *b ? recompute_policy::whole() : recompute_policy::none();
  if (auto s = node.value_exact<std::string>())
    if (auto p = parse_recompute(*s))
      return *p;
  throw config_error(path, "expected true, false or " +
                             std::string(recompute_choices) + ", got " +
                             std::string(toml_type_name(node)));
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

/// One [topology.<tier>] table: bandwidth_gb_per_s and latency_seconds,
/// both optional (absent: the chips' own figures).
/// [plan] chunks_per_chip, after the schedule and the chips are read.
void read_chunks_per_chip(table_reader& t, plan_config& p, int chips,
                          int layers) {
  p.chunks_given = t.has("chunks_per_chip");
  p.chunks_per_chip =
    positive_int(t, "chunks_per_chip", default_chunks_per_chip(p.schedule));
  if (p.chunks_given && !p.search_schedule &&
      p.chunks_per_chip != default_chunks_per_chip(p.schedule) &&
      p.schedule != schedule_kind::interleaved_1f1b &&
      p.schedule != schedule_kind::zb_hetero)
    throw config_error(t.path("chunks_per_chip"),
                       std::string(to_string(p.schedule)) +
                         " runs one chunk per chip; several need schedule = "
                         "\"interleaved-1f1b\" or \"zb-hetero\"");
  if (p.schedule == schedule_kind::interleaved_1f1b && !p.search_schedule &&
      p.chunks_per_chip < 2)
    throw config_error(t.path("chunks_per_chip"),
                       "interleaved-1f1b needs at least 2 chunks per chip");
  if (p.mode != plan_mode::automatic && p.chunks_per_chip > 1 &&
      chips * p.chunks_per_chip > layers)
    throw config_error(t.path("chunks_per_chip"),
                       std::to_string(chips) + " chips x " +
                         std::to_string(p.chunks_per_chip) +
                         " chunks need at least as many layers, but the "
                         "model has " +
                         std::to_string(layers));
}

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

/// [plan] mode and schedule ("auto" lets the planner choose the schedule).
void read_plan_mode_and_schedule(table_reader& t, plan_config& p) {
  p.mode = enum_value(t, "mode", p.mode, "\"even\", \"manual\", \"auto\"",
                      [](const std::string& s) -> std::optional<plan_mode> {
                        if (s == "even")
                          return plan_mode::even;
                        if (s == "manual")
                          return plan_mode::manual;
                        if (s == "auto")
                          return plan_mode::automatic;
                        return std::nullopt;
                      });
  if (auto s = t.maybe<std::string>("schedule"); s && *s == "auto") {
    if (p.mode != plan_mode::automatic)
      throw config_error(t.path("schedule"),
                         "\"auto\" lets the planner choose the schedule: it "
                         "needs mode = \"auto\"");
    p.search_schedule = true;
  } else {
    p.schedule = enum_value(
      t, "schedule", p.schedule, schedule_kind_choices() + ", \"auto\"",
      [](const std::string& s) { return parse_schedule_kind(s); });
  }
}

/// [plan] layers: every stage's layer count with mode = "manual", absent
/// otherwise (`layers` is the model's, `stages` the plan's).
void read_plan_layers(table_reader& t, plan_config& p, const job_config& job,
                      int chips, int layers, int stages) {
  const toml::array* layer_counts = t.maybe_array("layers");
  if (p.mode == plan_mode::manual) {
    if (layer_counts == nullptr)
      throw config_error(t.path("layers"),
                         "missing: plan.mode = \"manual\" needs the layers "
                         "of every stage");
    if (static_cast<int>(layer_counts->size()) != stages)
      throw config_error(
        t.path("layers"),
        "has " + std::to_string(layer_counts->size()) +
          " entries but the plan has " + std::to_string(stages) + " stages (" +
          std::to_string(chips) + " chips x " +
          std::to_string(p.chunks_per_chip) + " chunks_per_chip)");
    int sum = 0;
    for (std::size_t i = 0; i < layer_counts->size(); ++i) {
      std::string path = t.path("layers") + "[" + std::to_string(i) + "]";
      auto v = detail::toml_value<std::int64_t>((*layer_counts)[i], path);
      if (v < 1 || v > layers)
        throw config_error(path, "a stage needs between 1 and " +
                                   std::to_string(layers) + " layers, got " +
                                   std::to_string(v));
      p.layers.push_back(static_cast<int>(v));
      sum += static_cast<int>(v);
    }
    if (sum != layers)
      throw config_error(t.path("layers"), "sums to " + std::to_string(sum) +
                                             " but the model "
                                             "has " +
                                             std::to_string(layers) +
                                             " layers (" + "embedding + " +
                                             std::to_string(job.model.n_layer) +
                                             " blocks + head)");
  } else {
    if (layer_counts != nullptr)
      throw config_error(t.path("layers"),
                         "only allowed with plan.mode = \"manual\"");
    // auto: plan.stages lists the chips the planner may use; it chooses
    // the pipeline depth itself.
    if (p.mode == plan_mode::even && chips > layers)
      throw config_error(t.path("stages"), std::to_string(chips) +
                                             " stages but the model has "
                                             "only " +
                                             std::to_string(layers) +
                                             " layers");
  }
}

/// [plan] recompute: one entry per stage (none for every stage if absent).
void read_plan_recompute(table_reader& t, plan_config& p, int stages) {
  if (const toml::array* r = t.maybe_array("recompute")) {
    if (p.mode == plan_mode::automatic)
      throw config_error(t.path("recompute"),
                         "not allowed with plan.mode = \"auto\" (the "
                         "planner decides recomputation per stage)");
    if (static_cast<int>(r->size()) != stages)
      throw config_error(t.path("recompute"),
                         "has " + std::to_string(r->size()) +
                           " entries but the plan has " +
                           std::to_string(stages) + " stages");
    for (std::size_t i = 0; i < r->size(); ++i)
      p.recompute.push_back(recompute_entry(
        (*r)[i], t.path("recompute") + "[" + std::to_string(i) + "]"));
  } else {
    p.recompute.assign(stages, recompute_policy::none());
  }
}

} // namespace

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

/// The most nodes a job may declare (with `repeat`).
constexpr std::int64_t max_nodes = 1 << 20;

void read_nodes(table_reader& root, job_config& job) {
  const toml::array* nodes = root.maybe_array("nodes");
  if (nodes == nullptr || nodes->empty())
    throw config_error("nodes", "missing: declare at least one [[nodes]] "
                                "table with a chips = [...] list");
  int rank = 0, entry = 0;
  for (const toml::node& n : *nodes) {
    std::string path = "nodes[" + std::to_string(entry++) + "]";
    if (!n.is_table())
      throw config_error(path, "expected a table ([[nodes]])");
    table_reader t(*n.as_table(), path);
    // Identical nodes of a large cluster, declared once.
    const auto repeat = t.optional<std::int64_t>("repeat", 1);
    if (repeat < 1 || repeat > max_nodes - rank)
      throw config_error(t.path("repeat"),
                         "expected an integer from 1 to " +
                           std::to_string(max_nodes - rank) + " (at most " +
                           std::to_string(max_nodes) + " nodes in a job)");
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
    for (std::int64_t copy = 0; copy < repeat; ++copy, ++rank) {
      node.rank = rank;
      for (auto& chip : node.chips)
        chip.id.node = rank;
      job.nodes.push_back(node);
    }
  }
}

void read_plan(table_reader& root, job_config& job) {
  auto& p = job.plan;
  toml::table none;
  auto t = root.maybe_table("plan");
  if (!t)
    t.emplace(none, "plan");
  read_plan_mode_and_schedule(*t, p);
  if (const toml::array* a = t->maybe_array("stages")) {
    if (a->empty())
      throw config_error(t->path("stages"), "expected at least one chip id");
    p.stages = read_stage_chips(*a, t->path("stages"), job);
  } else {
    for (auto* c : job.chips())
      p.stages.push_back(c->id);
  }
  const int chips = static_cast<int>(p.stages.size());
  const int layers = job.model.num_layers();
  read_chunks_per_chip(*t, p, chips, layers);
  p.zero1 = t->optional<bool>("zero1", false);
  // Stages of the plan: a chunk each (one per chip unless chunks_per_chip).
  const int stages = chips * p.chunks_per_chip;
  read_plan_layers(*t, p, job, chips, layers, stages);
  read_plan_recompute(*t, p, stages);
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

} // namespace detail

} // namespace h2
