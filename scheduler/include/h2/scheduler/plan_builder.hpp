// Plans the job file asks for by hand: `even` (layers spread as evenly as
// possible over the stages) and `manual` (layers per stage as written).
// Automatic planning (HeteroAuto) builds on the same plan struct.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"

#include <vector>

namespace h2::scheduler {

/// Splits `layers` into `stages` contiguous counts differing by at most one;
/// the first stages get the extra layers (the last stage already holds the
/// LM head, usually the heaviest layer).
std::vector<int> even_split(int layers, int stages);

/// The plan of a job whose plan.mode is even or manual: one replica whose
/// stages are plan.stages in order, micro-batches of train.micro_batch.
/// Throws config_error for plan.mode = "auto" (planner.hpp plans those).
plan make_plan(const job_config& job);

/// The plan plan.mode = "even" would run with plan.stages = `chips` (in
/// that order): one stage per chip, layers spread by even_split(),
/// micro-batches of train.micro_batch, no recomputation. The baseline
/// HeteroAuto is compared with. Throws config_error when there are more
/// chips than layers or `chips` names a chip the job lacks.
plan even_plan(const job_config& job, const std::vector<chip_id>& chips);

} // namespace h2::scheduler
