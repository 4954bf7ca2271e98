// The job file's cluster sections: [profiles], [[nodes]], [plan] and
// [topology] (docs/job-file.md), read by parse_job in the order it states.
// Private to core/.
#pragma once

#include "h2/core/job.hpp"

#include "toml_reader.hpp"

namespace h2::detail {

/// [profiles]: the built-in catalog plus the job's own chip profiles.
void read_profiles(table_reader& root, job_config& job);

/// [[nodes]]: every node's chips (after read_profiles).
void read_nodes(table_reader& root, job_config& job);

/// [plan] (after read_nodes and the model).
void read_plan(table_reader& root, job_config& job);

/// [topology]: the link tiers between chips.
void read_topology(table_reader& root, job_config& job);

} // namespace h2::detail
