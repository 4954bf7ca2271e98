#include "h2/core/plan.hpp"

#include "h2/core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

namespace h2 {

int plan::global_batch() const noexcept {
  int n = 0;
  for (auto& r : replicas)
    n += r.sequences();
  return n;
}

namespace {

/// false and true for none and full (what version 2 files held before
/// selective recomputation), the policy's text otherwise.
nlohmann::json recompute_json(const recompute_policy& r) {
  if (!r.any() || r.full)
    return r.full;
  return to_string(r);
}

} // namespace

std::string to_json(const plan& p, int indent) {
  nlohmann::json j;
  j["format"] = "h2-plan";
  j["version"] = plan::format_version;
  j["schedule"] = std::string(to_string(p.schedule));
  if (p.zero1)
    j["zero1"] = true;
  j["replicas"] = nlohmann::json::array();
  for (auto& r : p.replicas) {
    nlohmann::json jr;
    jr["micro_batch_size"] = r.micro_batch_size;
    jr["micro_batches"] = r.micro_batches;
    jr["stages"] = nlohmann::json::array();
    for (auto& s : r.stages)
      jr["stages"].push_back({{"chip", s.chip.to_string()},
                              {"layers", {s.first_layer, s.end_layer}},
                              {"recompute", recompute_json(s.recompute)}});
    j["replicas"].push_back(std::move(jr));
  }
  return j.dump(indent);
}

namespace {

using json = nlohmann::json;

// `key` is a C string: a std::string made for the call would be a
// temporary, which GCC 13's -Wdangling-reference takes the result to point
// into.
const json& member(const json& j, const char* key, const std::string& path) {
  if (!j.is_object())
    throw config_error(path, "expected an object");
  auto i = j.find(key);
  if (i == j.end())
    throw config_error(path + "." + key, "missing required key");
  return *i;
}

int int_member(const json& j, const char* key, const std::string& path,
               int min, long long max = 1LL << 30) {
  const json& v = member(j, key, path);
  if (!v.is_number_integer() || v.get<long long>() < min ||
      v.get<long long>() > max)
    throw config_error(path + "." + key, "expected an integer from " +
                                           std::to_string(min) + " to " +
                                           std::to_string(max));
  return v.get<int>();
}

/// Sequences a plan may hold per step: train.global_batch's bound
/// (docs/job-file.md), so that no product of them overflows.
constexpr long long max_plan_sequences = 1LL << 20;

void reject_unknown(const json& j, const std::set<std::string>& known,
                    const std::string& path) {
  for (auto& [k, v] : j.items())
    if (known.count(k) == 0)
      throw config_error(path.empty() ? k : path + "." + k, "unknown key");
}

/// One entry of a replica's "stages" (at `spath`).
stage_plan plan_stage_from_json(const json& js, const std::string& spath) {
  if (!js.is_object())
    throw config_error(spath, "expected an object");
  reject_unknown(js, {"chip", "layers", "recompute"}, spath);
  stage_plan s;
  const json& chip = member(js, "chip", spath);
  auto id =
    chip.is_string() ? chip_id::parse(chip.get<std::string>()) : std::nullopt;
  if (!id)
    throw config_error(spath + ".chip", "expected \"<node>:<index>\"");
  s.chip = *id;
  const json& layers = member(js, "layers", spath);
  // Bounded before get<int>(): a larger number would wrap into a
  // plausible layer index.
  auto layer_index = [](const json& v) {
    return v.is_number_integer() && v.get<long long>() >= 0 &&
           v.get<long long>() <= (1LL << 30);
  };
  if (!layers.is_array() || layers.size() != 2 || !layer_index(layers[0]) ||
      !layer_index(layers[1]))
    throw config_error(spath + ".layers",
                       "expected [first, end] with layer indices in "
                       "[0, 2^30]");
  s.first_layer = layers[0].get<int>();
  s.end_layer = layers[1].get<int>();
  if (js.contains("recompute")) {
    const json& rc = js["recompute"];
    std::optional<recompute_policy> policy;
    if (rc.is_boolean())
      policy =
        rc.get<bool>() ? recompute_policy::whole() : recompute_policy::none();
    else if (rc.is_string())
      policy = parse_recompute(rc.get<std::string>());
    if (!policy)
      throw config_error(spath + ".recompute",
                         "expected true, false or " +
                           std::string(recompute_choices));
    s.recompute = *policy;
  }
  return s;
}

/// One entry of the plan's "replicas" (at `rpath`) of a plan file of
/// `version`; `sequences` sums the sequences per step over the replicas so
/// far.
replica_plan plan_replica_from_json(const json& jr, const std::string& rpath,
                                    int version, long long& sequences) {
  if (!jr.is_object())
    throw config_error(rpath, "expected an object");
  reject_unknown(jr, {"micro_batch_size", "micro_batches", "stages"}, rpath);
  replica_plan r;
  r.micro_batch_size =
    int_member(jr, "micro_batch_size", rpath, 1, max_plan_sequences);
  r.micro_batches =
    int_member(jr, "micro_batches", rpath, 1, max_plan_sequences);
  sequences += static_cast<long long>(r.micro_batch_size) * r.micro_batches;
  if (sequences > max_plan_sequences)
    throw config_error(rpath + ".micro_batches",
                       "the plan holds " + std::to_string(sequences) +
                         " sequences per step so far (micro_batch_size x "
                         "micro_batches, summed over replicas); at most " +
                         std::to_string(max_plan_sequences));
  const json& stages = member(jr, "stages", rpath);
  if (!stages.is_array() || stages.empty())
    throw config_error(rpath + ".stages", "expected a non-empty array");
  for (std::size_t si = 0; si < stages.size(); ++si) {
    std::string spath = rpath + ".stages[" + std::to_string(si) + "]";
    stage_plan s = plan_stage_from_json(stages[si], spath);
    if (version == 1)
      for (const auto& before : r.stages)
        if (before.chip == s.chip)
          throw config_error(spath + ".chip",
                             "chip " + s.chip.to_string() +
                               " holds two stages, which a version 1 "
                               "plan cannot express (write version 2)");
    r.stages.push_back(s);
  }
  return r;
}

} // namespace

plan plan_from_json(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number no double holds (1e400).
    throw config_error("", origin + ": invalid JSON: " + e.what());
  }
  std::string root = origin;
  if (!j.is_object())
    throw config_error(root, "expected a JSON object");
  reject_unknown(j, {"format", "version", "schedule", "replicas", "zero1"},
                 root);
  const json& fmt = member(j, "format", root);
  if (!fmt.is_string() || fmt.get<std::string>() != "h2-plan")
    throw config_error(root + ".format", "expected \"h2-plan\"");
  int version = int_member(j, "version", root, 1);
  if (version < 1 || version > plan::format_version)
    throw config_error(root + ".version",
                       "plan format version " + std::to_string(version) +
                         " is not supported (this build reads versions 1 "
                         "to " +
                         std::to_string(plan::format_version) + ")");
  plan p;
  const json& sched = member(j, "schedule", root);
  auto kind = sched.is_string() ? parse_schedule_kind(sched.get<std::string>())
                                : std::nullopt;
  if (!kind)
    throw config_error(root + ".schedule",
                       "expected one of " + schedule_kind_choices());
  p.schedule = *kind;
  if (j.contains("zero1")) {
    if (!j["zero1"].is_boolean())
      throw config_error(root + ".zero1", "expected true or false");
    p.zero1 = j["zero1"].get<bool>();
  }
  long long sequences = 0;
  const json& reps = member(j, "replicas", root);
  if (!reps.is_array() || reps.empty())
    throw config_error(root + ".replicas", "expected a non-empty array");
  for (std::size_t ri = 0; ri < reps.size(); ++ri) {
    std::string rpath = root + ".replicas[" + std::to_string(ri) + "]";
    p.replicas.push_back(
      plan_replica_from_json(reps[ri], rpath, version, sequences));
  }
  return p;
}

std::vector<reduction_group> reduction_groups(const plan& p) {
  std::vector<reduction_group> out;
  if (p.replicas.size() < 2)
    return out;
  int layers = p.replicas.front().stages.back().end_layer;
  auto holder = [](const replica_plan& r, int layer) {
    for (const auto& s : r.stages)
      if (s.first_layer <= layer && layer < s.end_layer)
        return s.chip;
    throw internal_error("layer " + std::to_string(layer) + " unassigned");
  };
  for (int l = 0; l < layers; ++l) {
    std::vector<chip_id> members;
    for (const auto& r : p.replicas)
      members.push_back(holder(r, l));
    if (!out.empty() && out.back().members == members &&
        out.back().end_layer == l)
      out.back().end_layer = l + 1;
    else
      out.push_back({l, l + 1, std::move(members)});
  }
  return out;
}

std::vector<chip_id> replica_chips(const replica_plan& r) {
  std::vector<chip_id> out;
  for (const auto& s : r.stages)
    if (std::find(out.begin(), out.end(), s.chip) == out.end())
      out.push_back(s.chip);
  return out;
}

std::vector<int> stage_positions(const replica_plan& r) {
  const auto chips = replica_chips(r);
  std::vector<int> out;
  for (const auto& s : r.stages)
    out.push_back(static_cast<int>(
      std::find(chips.begin(), chips.end(), s.chip) - chips.begin()));
  return out;
}

std::vector<chip_id> plan_chips(const plan& p) {
  std::vector<chip_id> out;
  for (const auto& r : p.replicas)
    for (const auto& c : replica_chips(r))
      out.push_back(c);
  return out;
}

std::vector<chip_link> plan_links(const plan& p, bool tied_embeddings) {
  std::set<chip_link> links;
  auto add = [&](chip_id x, chip_id y) {
    if (x != y)
      links.insert(x < y ? chip_link{x, y} : chip_link{y, x});
  };
  for (const auto& r : p.replicas)
    for (std::size_t s = 1; s < r.stages.size(); ++s)
      add(r.stages[s - 1].chip, r.stages[s].chip);
  for (const auto& g : reduction_groups(p))
    for (std::size_t i = 0; i < g.members.size(); ++i)
      add(g.members[i], g.members[(i + 1) % g.members.size()]);
  if (tied_embeddings)
    for (const auto& r : p.replicas)
      if (!r.stages.empty())
        add(r.stages.front().chip, r.stages.back().chip);
  return {links.begin(), links.end()};
}

namespace {

/// Transformer blocks among layers [first, end) of a model of `layers`
/// layers (the embedding is layer 0, the head the last).
int block_count(int first, int end, int layers) {
  return std::max(0, std::min(end, layers - 1) - std::max(first, 1));
}

} // namespace

void validate_plan(const plan& p, const job_config& job,
                   const std::string& origin) {
  std::set<chip_id> used; // by earlier replicas
  const int layers = job.model.num_layers();
  // A snapshot's gathers of the moments use ring steps up to 4 (R - 1) - 1
  // of the collective tags' 4096 (transport/collectives.hpp).
  if (p.shards_optimizer() && p.replicas.size() > plan::max_zero1_replicas)
    throw config_error(
      origin + ".zero1",
      "ZeRO-1 shards over at most " + std::to_string(plan::max_zero1_replicas) +
        " replicas, the plan has " + std::to_string(p.replicas.size()));
  for (std::size_t ri = 0; ri < p.replicas.size(); ++ri) {
    auto& r = p.replicas[ri];
    std::string rpath = origin + ".replicas[" + std::to_string(ri) + "]";
    int next = 0;
    for (std::size_t si = 0; si < r.stages.size(); ++si) {
      auto& s = r.stages[si];
      std::string spath = rpath + ".stages[" + std::to_string(si) + "]";
      if (job.find_chip(s.chip) == nullptr)
        throw config_error(spath + ".chip",
                           "no chip " + s.chip.to_string() + " in the job");
      if (used.count(s.chip) != 0)
        throw config_error(spath + ".chip", "chip " + s.chip.to_string() +
                                              " serves two replicas");
      if (si > 0 && r.stages[si - 1].chip == s.chip)
        throw config_error(spath + ".chip",
                           "chip " + s.chip.to_string() +
                             " also holds the stage before: one stage of "
                             "their layers would do");
      if (s.first_layer != next || s.end_layer <= s.first_layer)
        throw config_error(spath + ".layers",
                           "expected a non-empty range starting at layer " +
                             std::to_string(next) + ", got [" +
                             std::to_string(s.first_layer) + ", " +
                             std::to_string(s.end_layer) + ")");
      next = s.end_layer;
      const int blocks = block_count(s.first_layer, s.end_layer, layers);
      if (!s.recompute.full && s.recompute.blocks > blocks)
        throw config_error(spath + ".recompute",
                           "recomputes " + std::to_string(s.recompute.blocks) +
                             " blocks but the stage holds " +
                             std::to_string(blocks));
    }
    for (const auto& c : replica_chips(r))
      used.insert(c);
    if (next != layers)
      throw config_error(rpath + ".stages",
                         "cover layers [0, " + std::to_string(next) +
                           ") but the model has " + std::to_string(layers) +
                           " layers");
  }
  if (p.global_batch() != job.train.global_batch)
    throw config_error(origin + ".replicas",
                       "hold " + std::to_string(p.global_batch()) +
                         " sequences per step but train.global_batch = " +
                         std::to_string(job.train.global_batch));
}

} // namespace h2
