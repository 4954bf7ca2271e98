#include "h2/apps/session.hpp"

#include "h2/apps/cli.hpp"
#include "h2/runtime/hf_format.hpp"

#include "h2/apps/app.hpp"
#include "h2/core/error.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/runtime/auto_plan.hpp"
#include "h2/runtime/checkpointing.hpp"
#include "h2/runtime/safetensors.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace h2::apps {

int parse_and_run(CLI::App& cli, int argc, char** argv,
                  const std::string& program,
                  const std::function<int()>& body) {
  return run_app(program, [&] {
    if (const auto code = parse_cli(cli, argc, argv))
      return *code;
    return body();
  });
}

namespace {

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error("", path + ": cannot open " + what);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

} // namespace

std::string job_text(const std::string& path) {
  return path.empty() ? std::string(demo_job_toml())
                      : read_file(path, "job file");
}

std::shared_ptr<job_config> load_job(const std::string& path,
                                     const run_flags& flags) {
  auto job = std::make_shared<job_config>(
    parse_job(job_text(path), path.empty() ? "built-in demo.toml" : path));
  if (flags.steps > 0)
    job->train.steps = flags.steps;
  if (const auto& t = flags.join_timeout_seconds) {
    // The job key's range, named by the flag.
    if (!(std::isfinite(*t) && *t > 0 && *t <= 7 * 86400)) {
      std::ostringstream msg;
      msg << "expected a number of seconds in (0, 604800], got " << *t;
      throw config_error("--join-timeout", msg.str());
    }
    job->cluster.join_timeout_seconds = *t;
  }
  // H2_TRANSPORT overrides transport.backend (docs/job-file.md), as the
  // job file's own key would: the run reads the override from its config.
  if (const char* env = std::getenv("H2_TRANSPORT"); env != nullptr && *env) {
    const std::string backend = env;
    if (backend != "auto" && backend != "shm" && backend != "tcp" &&
        backend != "rdma")
      throw config_error("H2_TRANSPORT",
                         "expected \"auto\", \"shm\", \"tcp\" or \"rdma\", "
                         "got \"" + backend + "\"");
    job->transport.backend = backend;
  }
  if (job->admin.page == "token" && flags.admin_port < 0 &&
      job->admin.port == 0)
    throw config_error("admin.page",
                       "\"token\" serves the page on the admin endpoint: set "
                       "admin.port (or --admin-port)");
  return job;
}

void exclude_nodes(job_config& job, const std::vector<int>& ranks) {
  if (ranks.empty())
    return;
  for (int r : ranks)
    if (std::none_of(job.nodes.begin(), job.nodes.end(),
                     [r](const node_spec& n) { return n.rank == r; }))
      throw config_error("--exclude-nodes",
                         "the job has no node " + std::to_string(r));
  auto gone = [&](int rank) {
    return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
  };
  std::erase_if(job.nodes, [&](const node_spec& n) { return gone(n.rank); });
  if (job.nodes.empty())
    throw config_error("--exclude-nodes", "no node of the job is left");
  // HeteroAuto plans the chips that are left; they keep their ids.
  auto& p = job.plan;
  std::erase_if(p.stages, [&](const chip_id& c) { return gone(c.node); });
  if (p.mode != plan_mode::automatic)
    p.stages.clear(); // every chip that is left
  p.mode = plan_mode::automatic;
  p.layers.clear();
  p.recompute.clear();
}

std::string job_identity(const std::string& text,
                         const std::vector<int>& excluded) {
  if (excluded.empty())
    return text;
  std::string out = text + "\n# h2: nodes excluded:";
  for (int r : excluded)
    out += " " + std::to_string(r);
  return out + "\n";
}

namespace {

/// --init-from: the Hugging Face model as a checkpoint of step 0.
std::shared_ptr<const runtime::checkpoint>
init_from(const run_flags& flags, const job_config& job, const plan& p,
          const std::string& job_text) {
  if (!flags.resume.empty())
    throw config_error("--init-from", "not with --resume (a checkpoint "
                                      "brings its own weights)");
  auto c = std::make_shared<runtime::checkpoint>();
  c->layers = runtime::read_hf_model(flags.init_from, job.model, "--init-from");
  c->manifest = runtime::job_manifest(job, p, job_text);
  runtime::at_step(c->manifest, 0);
  c->dir = flags.init_from;
  if (!job.checkpoint.dir.empty()) {
    try {
      c->dir =
        runtime::write_checkpoint(job.checkpoint.dir, c->manifest, c->layers);
      c->manifest = runtime::read_manifest(c->dir);
    } catch (const runtime::checkpoint_error& e) {
      throw config_error("--init-from", e.what());
    }
  }
  std::cout << "h2: starting from " << flags.init_from
            << " (Hugging Face weights, fresh optimizer state"
            << (job.checkpoint.dir.empty() ? ""
                                           : ", saved as " + c->dir.string())
            << ")" << std::endl;
  return c;
}

} // namespace

std::shared_ptr<const runtime::checkpoint>
resume_from(const run_flags& flags, const job_config& job, const plan& p,
            const std::string& job_text) {
  if (!flags.init_from.empty())
    return init_from(flags, job, p, job_text);
  if (flags.resume.empty())
    return nullptr;
  std::filesystem::path dir = flags.resume;
  if (flags.resume == "latest") {
    if (job.checkpoint.dir.empty())
      throw config_error("--resume", "'latest' needs [checkpoint] dir in the "
                                     "job file");
    auto latest = runtime::latest_checkpoint(
      job.checkpoint.dir, [](const std::string& line) {
        std::cout << line << std::endl;
      });
    if (!latest)
      throw config_error("--resume", "no complete checkpoint under " +
                                       job.checkpoint.dir);
    dir = *latest;
  }
  try {
    auto c = std::make_shared<runtime::checkpoint>(runtime::read_checkpoint(dir));
    runtime::check_resumable(c->manifest, job, dir);
    std::cout << "h2: resuming from " << dir.string() << " (step "
              << c->manifest.step << " of " << job.train.steps << ")"
              << std::endl;
    return c;
  } catch (const runtime::checkpoint_error& e) {
    throw config_error("--resume", e.what());
  }
}

std::map<int, plan> replans_from(const run_flags& flags,
                                 const job_config& job) {
  std::map<int, plan> out;
  for (const auto& r : flags.replans) {
    const auto colon = r.find(':');
    int step = -1;
    try {
      if (colon != std::string::npos)
        step = std::stoi(r.substr(0, colon));
    } catch (const std::exception&) {
    }
    if (colon == std::string::npos || step < 0)
      throw config_error("--replan",
                         "expected STEP:PLAN.json, got \"" + r + "\"");
    const std::string path = r.substr(colon + 1);
    plan p = plan_from_json(read_file(path, "plan file"), path);
    scheduler::check_plan(p, job, path);
    if (!out.emplace(step, std::move(p)).second)
      throw config_error("--replan", "two re-plans before step " +
                                       std::to_string(step));
  }
  return out;
}

chosen_plan choose_plan(const run_flags& flags, const job_config& job) {
  if (!flags.plan_path.empty()) {
    plan p =
      plan_from_json(read_file(flags.plan_path, "plan file"), flags.plan_path);
    scheduler::check_plan(p, job, flags.plan_path);
    return {std::move(p), std::nullopt};
  }
  if (job.plan.mode != plan_mode::automatic)
    return {scheduler::make_plan(job), std::nullopt};
  std::cout << "h2: plan.mode = \"auto\": profiling the chips and planning"
            << std::endl;
  auto r = runtime::plan_job(job);
  std::cout << "h2: HeteroAuto: " << r.report.summary() << std::endl;
  std::istringstream why(r.report.explain());
  for (std::string line; std::getline(why, line);)
    std::cout << "h2:   " << line << std::endl;
  return {std::move(r.value), r.report.step_seconds};
}

void write_safetensors(const std::string& path,
                       const std::vector<runtime::parameter_values>& params,
                       const std::string& job_name) {
  std::vector<runtime::state_tensor> tensors;
  for (const auto& p : params)
    tensors.push_back(runtime::f32_tensor(p.name, p.shape, p.values));
  runtime::write_safetensors(path, tensors, {{"job", job_name}});
}

} // namespace h2::apps
