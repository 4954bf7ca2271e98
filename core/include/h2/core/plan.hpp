// The plan: which chips form which stages, which layers each stage holds,
// micro-batching and schedule (docs/architecture.md, "Plan"). A plain struct with a
// versioned JSON form that h2-plan prints and h2-launch --plan accepts.
#pragma once

#include "h2/core/chip_id.hpp"
#include "h2/core/job.hpp"
#include "h2/core/recompute.hpp"

#include <string>
#include <vector>

namespace h2 {

/// One pipeline stage (a chunk, docs/planner.md "Schedules"): a contiguous
/// range of global layers on one chip. A chip may hold several stages of its
/// replica (interleaved schedules); the stages' order is the pipeline's.
struct stage_plan {
  chip_id chip;
  int first_layer = 0; ///< inclusive
  int end_layer = 0;   ///< exclusive
  recompute_policy recompute;

  int num_layers() const noexcept { return end_layer - first_layer; }
  bool operator==(const stage_plan&) const = default;
};

/// One copy of the whole pipeline.
struct replica_plan {
  std::vector<stage_plan> stages;
  int micro_batch_size = 1; ///< sequences per micro-batch
  int micro_batches = 1;    ///< micro-batches per step

  int sequences() const noexcept { return micro_batch_size * micro_batches; }
  bool operator==(const replica_plan&) const = default;
};

struct plan {
  /// Version of the JSON form; bumped on incompatible changes. Version 2
  /// lets a chip hold several stages (chunks) of its replica; version 1
  /// files (one stage per chip) are still read.
  static constexpr int format_version = 2;

  schedule_kind schedule = schedule_kind::one_f_one_b;
  std::vector<replica_plan> replicas;
  /// ZeRO-1 (docs/planner.md, "Sharded optimizer state"): the AdamW
  /// moments of each reduction group are split across its members, each
  /// updating its share and all-gathering the parameters. No effect with
  /// one replica.
  bool zero1 = false;

  bool operator==(const plan&) const = default;

  /// The most replicas ZeRO-1 shards over (validate_plan).
  static constexpr std::size_t max_zero1_replicas = 1024;

  /// ZeRO-1 in effect: zero1 with more than one replica.
  bool shards_optimizer() const noexcept {
    return zero1 && replicas.size() > 1;
  }

  /// Sequences per step over all replicas.
  int global_batch() const noexcept;
};

/// Layers whose gradients are summed across replicas together: a maximal
/// run of layers held by the same chip in every replica.
struct reduction_group {
  int first_layer = 0; ///< inclusive
  int end_layer = 0;   ///< exclusive
  /// The chip holding these layers in each replica, in replica order (the
  /// ring of the all-reduce).
  std::vector<chip_id> members;

  bool operator==(const reduction_group&) const = default;
};

/// The reduction groups of a plan (empty with one replica). Replicas may
/// split the model differently: groups follow every replica's boundaries.
std::vector<reduction_group> reduction_groups(const plan& p);

/// Two chips that exchange tensors: neighbouring stages, or ring
/// neighbours of a reduction group. `a` < `b`; one channel serves both.
struct chip_link {
  chip_id a;
  chip_id b;

  auto operator<=>(const chip_link&) const = default;
};

/// The chips of replica `r`, each once, in the order of their first stage:
/// a chip's place in this list is its pipeline position.
std::vector<chip_id> replica_chips(const replica_plan& r);

/// For each stage of `r`, the pipeline position of its chip (its index in
/// replica_chips(r)).
std::vector<int> stage_positions(const replica_plan& r);

/// Every chip of `p` in plan order: replica by replica, chip by chip
/// (replica_chips(); the order of the runtime's worker set-ups and the
/// actors' chip lists).
std::vector<chip_id> plan_chips(const plan& p);

/// Every pair of chips of `p` that needs a channel, sorted: neighbouring
/// stages, reduction rings, and with `tied_embeddings` each replica's chips
/// of the embedding and of the head (they sum the tied weight's gradients).
std::vector<chip_link> plan_links(const plan& p, bool tied_embeddings = false);

/// The JSON form: {"format": "h2-plan", "version": 2, "schedule": "1f1b",
/// "replicas": [{"micro_batch_size": 4, "micro_batches": 8, "stages":
/// [{"chip": "0:0", "layers": [0, 3], "recompute": false}, ...]}]}.
/// "layers" is the half-open range [first, end) of global layers; a chip
/// may appear in several stages of its replica (version 2). "recompute" is
/// false (none), true (full) or another policy's text ("attention",
/// "2 blocks + attention": core/recompute.hpp).
std::string to_json(const plan& p, int indent = 2);

/// Parses the JSON form, versions 1 and 2; throws config_error naming the
/// JSON path ("replicas[0].stages[1].layers") for anything malformed.
plan plan_from_json(const std::string& text, const std::string& origin);

/// Checks `p` against the job: every chip exists and serves one replica,
/// no two neighbouring stages share a chip, each replica's stages cover
/// layers 0..num_layers() contiguously, micro-batches add up to the job's
/// global batch. Whether the schedule can run the stages' layout is the
/// scheduler's check (scheduler/plan_builder.hpp, check_plan).
/// Throws config_error (key path prefixed with `origin`).
void validate_plan(const plan& p, const job_config& job,
                   const std::string& origin);

} // namespace h2
