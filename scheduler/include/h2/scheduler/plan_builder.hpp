// Plans the job file asks for by hand: `even` (layers spread as evenly as
// possible over the stages) and `manual` (layers per stage as written).
// Automatic planning (HeteroAuto) builds on the same plan struct.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/scheduler/schedule.hpp"

#include <optional>
#include <vector>

namespace h2::scheduler {

/// Splits `layers` into `stages` contiguous counts differing by at most one;
/// the first stages get the extra layers (the last stage already holds the
/// LM head, usually the heaviest layer).
std::vector<int> even_split(int layers, int stages);

/// The plan of a job whose plan.mode is even or manual: one replica whose
/// stages are plan.stages in order, dealt plan.chunks_per_chip times round
/// by round, micro-batches of train.micro_batch.
/// Throws config_error for plan.mode = "auto" (planner.hpp plans those).
plan make_plan(const job_config& job);

/// The plan plan.mode = "even" would run with plan.stages = `chips` (in
/// that order): one stage per chip, layers spread by even_split(),
/// micro-batches of train.micro_batch, no recomputation. The baseline
/// HeteroAuto is compared with (plan.chunks_per_chip chunks per chip). Throws
/// config_error when there are more chips than layers or `chips` names a chip
/// the job lacks.
plan even_plan(const job_config& job, const std::vector<chip_id>& chips);

/// `p` (one stage per chip) with each chip's layers dealt into `v` chunks,
/// round by round (pipeline_layout::dealt): chunk r of chip k holds the
/// r-th of even_split(its layers, v), chips in `p`'s order within a round.
/// Each chip keeps its count of layers (a chip with fewer than `v` takes
/// layers from the chip with the most) and its recomputation. nullopt when
/// a replica has one chip or fewer layers than chips x `v`. The schedule
/// is left as `p`'s.
std::optional<plan> deal_chunks(const plan& p, int v);

/// The chunks per chip of `p` (its first replica's stages over its chips).
int chunks_per_chip(const plan& p);

/// Which chip (pipeline position, replica_chips()) holds which stage of `r`.
pipeline_layout layout_of(const replica_plan& r);

/// validate_plan(), then throws config_error (key
/// `origin`.replicas[i].stages) when `p`'s schedule cannot run the layout
/// of a replica's stages (layout_problem()): several chunks per chip under
/// 1f1b, gpipe or zb-h1, uneven or non-dealt chunks or fewer micro-batches
/// than chips under interleaved-1f1b. How every plan from outside (a file,
/// the admin, a re-plan) is checked.
void check_plan(const plan& p, const job_config& job,
                const std::string& origin);

} // namespace h2::scheduler
