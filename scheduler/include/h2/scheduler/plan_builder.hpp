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
plan make_plan(const job_config& job);

} // namespace h2::scheduler
