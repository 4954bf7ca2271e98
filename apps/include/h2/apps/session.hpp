// What h2-launch and h2-node share around a training run: the common flags,
// loading the job and the plan, exporting the model (apps/endpoints.hpp:
// what a run serves over HTTP).
#pragma once

#include "h2/apps/run_flags.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/reports.hpp"

#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace h2::apps {

/// Parses `argv` into `cli` (a parse error is a config_error: one line,
/// exit 2) and runs `body` under run_app.
int parse_and_run(CLI::App& cli, int argc, char** argv,
                  const std::string& program, const std::function<int()>& body);

/// The job (the built-in demo when `path` is empty), with --steps,
/// --join-timeout and the H2_TRANSPORT environment variable
/// (transport.backend) applied. Throws config_error.
std::shared_ptr<job_config> load_job(const std::string& path,
                                     const run_flags& flags);

/// Marks the chips of the nodes `ranks` unavailable (a restart after they
/// failed, docs/checkpoints.md): drops those nodes from `job`, and lets
/// HeteroAuto plan the chips that are left (plan.mode = "auto"; chip ids
/// do not change). Throws config_error("--exclude-nodes") for a rank the
/// job does not have, or when no node is left.
void exclude_nodes(job_config& job, const std::vector<int>& ranks);

/// What the nodes of a job compare when they join (transport::job_digest of
/// it): the job file's text and the nodes excluded from it.
std::string job_identity(const std::string& text,
                         const std::vector<int>& excluded);

/// The job file's text (the built-in demo's when `path` is empty).
std::string job_text(const std::string& path);

/// The checkpoint --resume names (a directory, or "latest": the newest
/// complete one under checkpoint.dir, skipping incomplete ones with a
/// line each), read and checked against `job`; or, with --init-from, the
/// Hugging Face model it names as a checkpoint of step 0 (weights only,
/// fresh optimizer state; written under checkpoint.dir as step 0 when the
/// job has one, which --nodes needs); null without either. `p` and
/// `job_text` are the run's (the step-0 manifest records them). Throws
/// config_error naming --resume, --init-from or the key that may not change
/// (exit 2), also for a damaged checkpoint (its checkpoint_error's text).
std::shared_ptr<const runtime::checkpoint>
resume_from(const run_flags& flags, const job_config& job, const plan& p,
            const std::string& job_text);

/// The live re-plans --replan asks for: step -> plan, each read from its
/// JSON file and checked against `job` (validate_plan; that it keeps the
/// run's chips is checked when the run starts). Throws config_error
/// naming --replan or the file.
std::map<int, plan> replans_from(const run_flags& flags, const job_config& job);

/// The plan a run trains, and HeteroAuto's prediction when it made it.
struct chosen_plan {
  plan value;
  std::optional<double> predicted_step_seconds;
};

/// --plan's plan (validated against `job`), else the job's [plan]: for
/// plan.mode = "auto" HeteroAuto profiles the chips, plans, and prints its
/// prediction and why the plan won. Throws config_error (an infeasible job
/// names what does not fit where and one change that does).
chosen_plan choose_plan(const run_flags& flags, const job_config& job);

/// Writes parameters as a safetensors file (runtime::write_safetensors: a
/// JSON header of names, dtypes, shapes and offsets, then the raw
/// little-endian data). Throws runtime::checkpoint_error (kind io) when the
/// file cannot be written.
void write_safetensors(const std::string& path,
                       const std::vector<runtime::parameter_values>& params,
                       const std::string& job_name);

} // namespace h2::apps
