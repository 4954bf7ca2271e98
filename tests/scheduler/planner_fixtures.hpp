// What the planner tests share: jobs built from TOML, measurements of the
// tests' own (a roofline with irregular per-kind quirks: deliberately
// neither the emulated chips' cost function nor anything the planner could
// guess), random heterogeneous instances, and brute force over a stage-1
// candidate.
#pragma once

#include "h2/core/job.hpp"
#include "h2/scheduler/planner.hpp"
#include "h2/scheduler/schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace h2::test {

/// A chip kind of a synthetic cluster ([profiles.<name>] of the job).
struct kind_spec {
  std::string name;
  std::string vendor = "Acme";
  double bf16_tflops = 300;
  double memory_gib = 64;
  double interconnect_gb_per_s = 200;
  double link_latency_seconds = 5e-6;
};

/// The TOML of a job: the kinds as [profiles.*], `nodes[i]` the kind names
/// of node i's chips, a GPT of `n_layer` blocks (small dimensions),
/// `global_batch` sequences, `schedule`, chip memory x `memory_scale`,
/// `extra` appended (e.g. a [topology] table).
inline std::string job_toml(const std::vector<kind_spec>& kinds,
                            const std::vector<std::vector<std::string>>& nodes,
                            int n_layer, int global_batch,
                            schedule_kind schedule, double memory_scale,
                            const std::string& extra = "",
                            const std::string& plan_mode = "auto") {
  std::ostringstream t;
  t << "[model]\nvocab_size = 64\nseq_len = 32\nd_model = 64\nn_head = 4\n"
    << "n_layer = " << n_layer << "\n\n[data]\nsource = \"markov\"\n"
    << "entropy_rate = 1.0\n\n[train]\nglobal_batch = " << global_batch
    << "\n\n[emulation]\nmemory_scale = " << memory_scale << "\n\n";
  for (const auto& n : nodes) {
    t << "[[nodes]]\nchips = [";
    for (std::size_t i = 0; i < n.size(); ++i)
      t << (i ? ", " : "") << "\"emulated:" << n[i] << "\"";
    t << "]\n";
  }
  t << "\n[plan]\nmode = \"" << plan_mode << "\"\nschedule = \""
    << to_string(schedule) << "\"\n\n";
  for (const auto& k : kinds)
    t << "[profiles." << k.name << "]\nvendor = \"" << k.vendor
      << "\"\nmodel = \"" << k.name
      << "\"\npeak_tflops = { fp32 = " << k.bf16_tflops / 8
      << ", bf16 = " << k.bf16_tflops << ", fp16 = " << k.bf16_tflops
      << " }\nmemory_gib = " << k.memory_gib
      << "\nmemory_bandwidth_gb_per_s = 2000\ninterconnect_gb_per_s = "
      << k.interconnect_gb_per_s << "\nsource = \"test\"\n[profiles." << k.name
      << ".emulation]\nlink_latency_seconds = " << k.link_latency_seconds
      << "\n\n";
  t << extra;
  return t.str();
}

/// Measurements of the tests' own: time = overhead + FLOPs / (peak x
/// efficiency(rows)) x quirk(kind, layer kind), quirks drawn from `seed`.
class synthetic_measurements final : public scheduler::chip_measurements {
public:
  synthetic_measurements(const job_config& job, std::uint64_t seed)
      : job_(&job), seed_(seed) {}

  scheduler::layer_timing layer(const chip_spec& chip, layer_kind kind,
                                int micro_batch_size) override {
    ++calls;
    int index = kind == layer_kind::embedding ? 0
                : kind == layer_kind::block   ? 1
                                              : job_->model.n_layer + 1;
    auto w = compute_layer_work(job_->model, index, micro_batch_size,
                                chip.compute_dtype);
    double peak = chip.profile.peak_flops(chip.compute_dtype);
    double eff = 0.5 * w.rows / (w.rows + 64.0);
    double q = quirk(chip, kind);
    return {20e-6 + q * w.forward_flops / (peak * eff),
            30e-6 + q * w.backward_flops / (peak * eff)};
  }

  double optimizer(const chip_spec& chip, layer_kind kind) override {
    ++calls;
    int index = kind == layer_kind::embedding ? 0
                : kind == layer_kind::block   ? 1
                                              : job_->model.n_layer + 1;
    return 10e-6 + 28.0 *
                     static_cast<double>(layer_parameters(job_->model, index)) /
                     (2e12 * quirk(chip, kind));
  }

  int calls = 0;

private:
  double quirk(const chip_spec& chip, layer_kind kind) const {
    std::seed_seq s{seed_, std::hash<std::string>{}(chip.profile.name),
                    static_cast<std::uint64_t>(kind)};
    std::mt19937_64 g(s);
    return std::uniform_real_distribution<double>(0.6, 1.6)(g);
  }

  const job_config* job_;
  std::uint64_t seed_;
};

/// A random heterogeneous job and its measurements.
struct instance {
  std::unique_ptr<job_config> job;
  std::unique_ptr<synthetic_measurements> measurements;
};

/// `chips` chips of up to `kinds` kinds (different speed, memory,
/// interconnect, vendor), one to three nodes, `layers` pipeline layers,
/// memory scaled so that the model's state takes `tightness` times less
/// than all chips' memory (memory binds for small tightness).
inline instance random_instance(std::uint64_t seed, int chips, int kinds,
                                int layers, int global_batch,
                                schedule_kind schedule, double tightness = 0) {
  std::mt19937_64 g(seed);
  auto uni = [&](double a, double b) {
    return std::uniform_real_distribution<double>(a, b)(g);
  };
  std::vector<kind_spec> ks;
  for (int k = 0; k < kinds; ++k)
    ks.push_back({std::string("k").append(std::to_string(k)),
                  k % 2 == 0 ? "VendorA" : "VendorB",
                  std::round(uni(100, 1000)), std::round(uni(16, 192)),
                  std::round(uni(20, 400)), uni(1e-6, 2e-5)});
  std::vector<std::string> names;
  for (int c = 0; c < chips; ++c)
    names.push_back(
      ks[static_cast<std::size_t>(
           c < kinds ? c : std::uniform_int_distribution<int>(0, kinds - 1)(g))]
        .name);
  std::sort(names.begin(), names.end());
  const int node_count = std::uniform_int_distribution<int>(1, 3)(g);
  std::vector<std::vector<std::string>> nodes(
    static_cast<std::size_t>(std::min(node_count, chips)));
  for (int c = 0; c < chips; ++c)
    nodes[static_cast<std::size_t>(c) * nodes.size() /
          static_cast<std::size_t>(chips)]
      .push_back(names[static_cast<std::size_t>(c)]);
  // Memory: parse once at scale 1 to size the model against the chips.
  const int n_layer = layers - 2;
  job_config probe = parse_job(
    job_toml(ks, nodes, n_layer, global_batch, schedule, 1.0), "probe");
  double total = 0;
  for (const auto* c : probe.chips())
    total += static_cast<double>(c->profile.memory_bytes);
  double state = 16.0 * static_cast<double>(model_parameters(probe.model));
  if (tightness <= 0)
    tightness = uni(1.3, 4.0);
  double scale = tightness * state / total;
  std::ostringstream extra;
  if (uni(0, 1) < 0.5)
    extra << "[topology]\n[topology.between_hosts]\nbandwidth_gb_per_s = "
          << uni(5, 50)
          << "\nlatency_seconds = 2e-5\n[topology.between_islands]\n"
          << "bandwidth_gb_per_s = " << uni(1, 10) << "\n";
  std::ostringstream origin;
  origin << "random-" << seed;
  instance out;
  out.job = std::make_unique<job_config>(parse_job(
    job_toml(ks, nodes, n_layer, global_batch, schedule, scale, extra.str()),
    origin.str()));
  out.measurements =
    std::make_unique<synthetic_measurements>(*out.job, seed * 7 + 1);
  return out;
}

/// Every way to cut `layers` layers into `parts` non-empty contiguous
/// stages, as stage ends.
inline std::vector<std::vector<int>> partitions(int layers, int parts) {
  std::vector<std::vector<int>> out;
  std::vector<int> ends;
  std::function<void(int, int)> rec = [&](int start, int left) {
    if (left == 1) {
      ends.push_back(layers);
      out.push_back(ends);
      ends.pop_back();
      return;
    }
    for (int end = start + 1; end <= layers - (left - 1); ++end) {
      ends.push_back(end);
      rec(end, left - 1);
      ends.pop_back();
    }
  };
  rec(0, parts);
  return out;
}

inline std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}

/// One group's option in the brute force: a partition, a micro-batch size
/// and per-stage recomputation.
struct brute_option {
  std::vector<int> ends;
  int micro_batch_size = 1;
  std::vector<recompute_policy> recompute;
};

/// The brute-force minimum over a stage-1 candidate: every split of the
/// batch between its groups, every partition and micro-batch size of each
/// group (its replicas alike, as the candidate prescribes), and per stage
/// recomputation: every subset when `all_recompute` (else, per stage, only
/// where it does not fit otherwise, by the cost model and the chip's
/// capacity). Each choice is simulated as a whole plan. inf when nothing
/// fits.
inline double brute_force(scheduler::planner& pl,
                          const scheduler::pipeline_candidate& c,
                          const job_config& job, bool all_recompute,
                          std::size_t* evaluated = nullptr) {
  const int L = job.model.num_layers();
  const int B = job.train.global_batch;
  const auto& chips = pl.chips();
  const std::size_t G = c.groups.size();
  double best = std::numeric_limits<double>::infinity();
  auto options_of = [&](std::size_t g, int seqs) {
    std::vector<brute_option> out;
    const auto& grp = c.groups[g];
    const int p = static_cast<int>(grp.replicas.front().size());
    for (const auto& ends : partitions(L, p))
      for (int mu : divisors(seqs)) {
        if (all_recompute) {
          for (int mask = 0; mask < (1 << p); ++mask) {
            std::vector<recompute_policy> rc;
            for (int s = 0; s < p; ++s)
              rc.push_back(((mask >> s) & 1) != 0 ? recompute_policy::whole()
                                                  : recompute_policy::none());
            out.push_back({ends, mu, rc});
          }
        } else {
          // Per stage the least recomputation that fits every replica's
          // chip (the replicas of a group are alike), none when nothing
          // fits (the simulation then fails).
          std::vector<recompute_policy> rc;
          int first = 0;
          for (int s = 0; s < p; ++s) {
            int end = ends[static_cast<std::size_t>(s)];
            std::optional<scheduler::stage_cost> fit;
            bool fits = true;
            for (const auto& rep : grp.replicas) {
              const chip_spec& chip = *chips[static_cast<std::size_t>(
                rep[static_cast<std::size_t>(s)])];
              fit = pl.costs().coefficients(chip, mu).fitting(
                scheduler::stage_layers::of(job.model, first, end),
                scheduler::in_flight_bound(pl.schedule(), p, s, seqs / mu),
                pl.costs().capacity_bytes(chip), pl.options().recompute);
              fits = fits && fit.has_value();
            }
            rc.push_back(fits ? fit->recompute : recompute_policy::whole());
            first = end;
          }
          out.push_back({ends, mu, rc});
        }
      }
    return out;
  };
  // Splits of the batch: a positive multiple of each group's replicas.
  std::vector<int> unit(G), split(G);
  for (std::size_t g = 0; g < G; ++g)
    unit[g] = static_cast<int>(c.groups[g].replicas.size());
  std::vector<std::vector<int>> splits;
  std::function<void(std::size_t, int)> rec = [&](std::size_t g, int left) {
    if (g + 1 == G) {
      if (left >= unit[g] && left % unit[g] == 0) {
        split[g] = left;
        splits.push_back(split);
      }
      return;
    }
    for (int x = unit[g]; x <= left; x += unit[g]) {
      split[g] = x;
      rec(g + 1, left - x);
    }
  };
  rec(0, B);
  std::map<std::pair<std::size_t, int>, std::vector<brute_option>> cache;
  for (const auto& s : splits) {
    std::vector<const std::vector<brute_option>*> opts;
    for (std::size_t g = 0; g < G; ++g) {
      auto key = std::make_pair(g, s[g] / unit[g]);
      if (!cache.count(key))
        cache[key] = options_of(g, s[g] / unit[g]);
      opts.push_back(&cache[key]);
    }
    std::vector<std::size_t> pick(G, 0);
    std::function<void(std::size_t)> choose = [&](std::size_t g) {
      if (g == G) {
        plan p;
        p.schedule = pl.schedule();
        for (std::size_t q = 0; q < G; ++q) {
          const auto& o = (*opts[q])[pick[q]];
          for (const auto& rep : c.groups[q].replicas) {
            replica_plan r;
            r.micro_batch_size = o.micro_batch_size;
            r.micro_batches = s[q] / unit[q] / o.micro_batch_size;
            int first = 0;
            for (std::size_t st = 0; st < rep.size(); ++st) {
              r.stages.push_back({chips[static_cast<std::size_t>(rep[st])]->id,
                                  first, o.ends[st], o.recompute[st]});
              first = o.ends[st];
            }
            p.replicas.push_back(std::move(r));
          }
        }
        auto sim = pl.simulate(p);
        if (evaluated)
          ++*evaluated;
        if (sim.fits)
          best = std::min(best, sim.step_seconds);
        return;
      }
      for (pick[g] = 0; pick[g] < opts[g]->size(); ++pick[g])
        choose(g + 1);
    };
    choose(0);
  }
  return best;
}

/// Relative difference, 0 when both are infinite.
inline double relative(double a, double b) {
  if (std::isinf(a) && std::isinf(b))
    return 0;
  return std::abs(a - b) / std::max(std::abs(a), std::abs(b));
}

} // namespace h2::test
