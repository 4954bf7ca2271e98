// h2-node: one node of a job that runs in several processes (launched by
// h2-launch --nodes, srun, mpirun or by hand). Rank 0 hosts the
// coordinator. docs/cli.md.
#include "h2/actors/cluster.hpp"
#include "h2/actors/errors.hpp"
#include "h2/apps/endpoints.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/apps/node_report.hpp"
#include "h2/apps/opcheck.hpp"
#include "h2/apps/reporter.hpp"
#include "h2/apps/session.hpp"
#include "h2/apps/signals.hpp"
#include "h2/transport/handshake.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <netdb.h>
#include <optional>
#include <sys/socket.h>
#include <unistd.h>

namespace {

using namespace h2;

struct node_flags {
  std::string job_path;
  int rank = -1;
  int world_size = -1;
  std::string coordinator;
  std::string bind;
  std::string secret_file;
  std::vector<int> exclude;
  int restarts = 0;
  std::string test_fault; ///< --test-fault: tests of the [ditorch] check
  pid_t launcher_pid = 0;   ///< --launcher-pid: h2-launch --nodes sets it
  int report_fd = -1;       ///< --report-fd: where h2-launch reads events
  std::string launcher_dir; ///< --launcher-dir: its temporary directory
  apps::run_flags run;
};

/// The first of `names` set in the environment, as an integer.
std::optional<int> env_int(std::initializer_list<const char*> names,
                           const char*& which) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v != nullptr && *v != '\0') {
      which = n;
      try {
        return std::stoi(v);
      } catch (const std::exception&) {
        throw config_error(n, std::string("expected an integer, got \"") + v +
                                "\"");
      }
    }
  return std::nullopt;
}

/// The local address that routes to `host` (what peers should dial).
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr)
    return "127.0.0.1";
  std::string out = "127.0.0.1";
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char buf[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof(buf)) != nullptr)
      out = buf;
  }
  if (fd >= 0)
    ::close(fd);
  ::freeaddrinfo(res);
  return out;
}

/// This process's node: its rank and the world size from the flags or
/// the launcher's environment (Slurm, Open MPI, torchrun), checked against
/// the job's nodes.
const node_spec& this_node_of(node_flags& nf, const job_config& job) {
  const auto& nodes = job.nodes;
  const char* source = "--node-rank";
  if (nf.rank < 0) {
    auto r = env_int({"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "RANK"}, source);
    if (!r)
      throw config_error("--node-rank",
                         "missing: pass --node-rank or run under Slurm "
                         "(SLURM_PROCID), Open MPI (OMPI_COMM_WORLD_RANK) or "
                         "torchrun-style RANK");
    // The i-th process runs the i-th node that is left.
    nf.rank = *r >= 0 && *r < static_cast<int>(nodes.size())
                ? nodes[static_cast<std::size_t>(*r)].rank
                : *r;
  }
  const char* world_source = "--world-size";
  if (nf.world_size < 0) {
    auto w = env_int({"SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"},
                     world_source);
    nf.world_size = w.value_or(static_cast<int>(nodes.size()));
  }
  if (nf.world_size != static_cast<int>(nodes.size()))
    throw config_error(world_source,
                       std::to_string(nf.world_size) +
                         " processes but the job declares " +
                         std::to_string(nodes.size()) + " [[nodes]]" +
                         (nf.exclude.empty() ? "" : " that are not excluded"));
  const auto this_node =
    std::find_if(nodes.begin(), nodes.end(),
                 [&](const node_spec& n) { return n.rank == nf.rank; });
  if (this_node == nodes.end())
    throw config_error(source, "node rank " + std::to_string(nf.rank) +
                                 " is not one of the job's nodes " +
                                 (nf.exclude.empty()
                                    ? "[0, " + std::to_string(nodes.size()) +
                                        ")"
                                    : "that are not excluded"));
  return *this_node;
}

/// The coordinator's host and port, from --coordinator or MASTER_ADDR and
/// MASTER_PORT.
std::pair<std::string, std::uint16_t> coordinator_of(node_flags& nf) {
  if (nf.coordinator.empty()) {
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    if (addr == nullptr || port == nullptr)
      throw config_error("--coordinator",
                         "missing: pass --coordinator HOST:PORT or set "
                         "MASTER_ADDR and MASTER_PORT");
    nf.coordinator = std::string(addr) + ":" + port;
  }
  auto colon = nf.coordinator.rfind(':');
  int port = -1;
  try {
    if (colon != std::string::npos)
      port = std::stoi(nf.coordinator.substr(colon + 1));
  } catch (const std::exception&) {
  }
  if (colon == std::string::npos || colon == 0 || port < 0 || port > 65535)
    throw config_error("--coordinator",
                       "expected HOST:PORT, got \"" + nf.coordinator + "\"");
  return {nf.coordinator.substr(0, colon), static_cast<std::uint16_t>(port)};
}

/// The coordinator's node plans (HeteroAuto too) for every node, and reads
/// and checks the checkpoint a run resumes from (every node then loads its
/// own chips' layers from the directory). Returns the plan's predicted
/// step time.
std::optional<double> plan_as_lead(const node_flags& nf, const job_config& job,
                                   actors::node_options& o) {
  auto chosen = apps::choose_plan(nf.run, job);
  o.plan_override = std::move(chosen.value);
  if (!nf.run.init_from.empty() && job.checkpoint.dir.empty())
    throw config_error("--init-from",
                       "over nodes it needs [checkpoint] dir: the converted "
                       "weights are saved there as step 0 for every node "
                       "to load");
  if (auto c = apps::resume_from(nf.run, job, *o.plan_override,
                                 apps::job_text(nf.job_path))) {
    auto located = std::make_shared<runtime::checkpoint>();
    located->dir = c->dir;
    located->manifest = c->manifest;
    o.run.resume = std::move(located);
  }
  o.run.replans = apps::replans_from(nf.run, job);
  return chosen.predicted_step_seconds;
}

/// What cluster_node needs of this node: the job and its identity, where
/// the coordinator is, the secret, the run's steps, and where to log.
actors::node_options node_options_of(const node_flags& nf,
                                     std::shared_ptr<job_config> job, int lead,
                                     const std::string& coordinator_host,
                                     std::uint16_t coordinator_port,
                                     const std::string& secret_file) {
  actors::node_options o;
  o.job = job;
  o.job_digest = transport::job_digest(
    apps::job_identity(apps::job_text(nf.job_path), nf.exclude));
  o.rank = nf.rank;
  o.world_size = nf.world_size;
  o.coordinator_rank = lead;
  o.coordinator_host = coordinator_host;
  o.coordinator_port = coordinator_port;
  o.join_timeout = std::chrono::ceil<std::chrono::milliseconds>(
    std::chrono::duration<double>(job->cluster.join_timeout_seconds));
  o.bind_host =
    !nf.bind.empty() ? nf.bind : local_address_towards(o.coordinator_host);
  o.secret = std::make_shared<const transport::job_secret>(
    transport::job_secret::from_file(secret_file));
  o.run.job_text = apps::job_text(nf.job_path);
  o.run.steps = nf.run.stop_after > 0
                  ? std::min(nf.run.stop_after, job->train.steps)
                  : job->train.steps;
  o.run.collect_parameters = !nf.run.export_path.empty();
  o.log = [](const std::string& line) {
    std::cout << "h2: " << line << std::endl;
  };
  return o;
}

/// What this node reports: the coordinator's node the run's progress,
/// logs and trace; the others only what goes wrong.
apps::reporter_options reporter_options_of(const node_flags& nf,
                                           const job_config& job, int lead,
                                           std::optional<double> predicted) {
  apps::reporter_options ro;
  ro.total_steps = job.train.steps;
  ro.quiet = nf.run.quiet || nf.rank != lead;
  ro.restarts = nf.restarts;
  if (nf.rank == lead) {
    ro.json_log = nf.run.json_log;
    ro.trace = nf.run.trace;
    ro.predicted_step_seconds = predicted;
  }
  return ro;
}

/// This node's chips, before it joins ([ditorch] check). On a failure the
/// coordinator's node exits (the exit code returned); another node joins
/// only to tell the coordinator, which ends the job naming it.
int check_chips(const node_flags& nf, const job_config& job,
                const node_spec& this_node, int lead, actors::node_options& o) {
  std::vector<const chip_spec*> mine;
  for (const auto& c : this_node.chips)
    mine.push_back(&c);
  apps::print_cpu_bf16("h2-node", mine, std::cout);
  if (!job.ditorch.check)
    return apps::exit_ok;
  auto options = apps::opcheck_options_of(job);
  options.fault = nf.test_fault;
  const int rc =
    apps::check_chip_operators("h2-node", job, mine, options, std::cout);
  if (rc != apps::exit_ok && nf.rank == lead)
    return rc;
  if (rc != apps::exit_ok)
    o.withdraw = "its chips failed the operator check ([ditorch] check)";
  return apps::exit_ok;
}

int run_node(node_flags& nf) {
  // What h2-launch --nodes learns of this node, on a channel of its own.
  apps::node_report report(nf.report_fd);
  report.state("starting");
  // From the start: a signal while a checkpoint loads ends the node too.
  apps::signal_watcher signals(nullptr);
  auto setting_up = signals.exiting("h2-node");
  auto job = apps::load_job(nf.job_path, nf.run);
  apps::exclude_nodes(*job, nf.exclude);
  const node_spec& this_node = this_node_of(nf, *job);
  const int lead = job->nodes.front().rank; // hosts the coordinator
  const auto [coordinator_host, coordinator_port] = coordinator_of(nf);
  std::string secret_file =
    !nf.secret_file.empty() ? nf.secret_file : job->security.secret_file;
  if (secret_file.empty())
    throw config_error("security.secret_file",
                       "missing: nodes prove the job's secret to each other; "
                       "set it in the job file or pass --secret-file");
  auto o = node_options_of(nf, job, lead, coordinator_host, coordinator_port,
                           secret_file);
  o.on_listening = [&report, host = coordinator_host](std::uint16_t p) {
    std::cout << "h2-node: coordinator at " << host << ":" << p << std::endl;
    report.listening("coordinator", host, p);
  };
  if (int rc = check_chips(nf, *job, this_node, lead, o); rc != apps::exit_ok)
    return rc;
  std::optional<double> predicted;
  if (nf.rank == lead)
    predicted = plan_as_lead(nf, *job, o);

  // The coordinator's node serves the admin endpoint and the live page.
  runtime::run_view view(*job, job->train.steps);
  apps::run_endpoints endpoints(*job, nf.run,
                                {.port_offset = nf.rank,
                                 .admin = nf.rank == lead,
                                 .page = nf.rank == lead ? &view : nullptr},
                                "h2-node");
  if (endpoints.metrics_port() != 0)
    report.listening("metrics", job->metrics.bind, endpoints.metrics_port());
  if (endpoints.admin_port() != 0)
    report.listening("admin", job->admin.bind, endpoints.admin_port());
  o.run.admin = endpoints.inbox();
  const auto ro = reporter_options_of(nf, *job, lead, predicted);
  apps::reporter reporter(*job, ro, endpoints.registry());
  runtime::observer_fanout observers(
    nf.rank == lead ? std::vector<runtime::training_observer*>{&reporter, &view}
                    : std::vector<runtime::training_observer*>{&reporter});
  o.observer = &observers;

  // A second signal aborts the node while it lives (the watcher may fire
  // before it exists, and outlives it).
  o.stop = signals.stop_flag();
  setting_up.reset();
  report.state("running"); // joining, then training
  actors::cluster_node node(o);
  const auto abort_node = signals.aborting([&node] { node.abort(); });
  actors::node_outcome outcome;
  try {
    outcome = node.run();
  } catch (const actors::run_error& e) {
    if (o.withdraw) { // the check printed why; and the join, if it failed
      if (e.what() != *o.withdraw)
        std::cerr << "h2-node: " << e.what() << std::endl;
      return apps::exit_check_failed;
    }
    if (signals.stop_flag()->load() >= 2) {
      std::cerr << "h2-node " << nf.rank << ": aborted by signal "
                << signals.signal() << std::endl;
      return apps::exit_signal_base + signals.signal();
    }
    throw;
  }
  if (nf.rank == lead) {
    reporter.finish(outcome.summary);
    view.finish(outcome.summary);
    if (!nf.run.export_path.empty()) {
      apps::write_safetensors(nf.run.export_path, outcome.parameters,
                              job->name);
      std::cout << "h2: parameters written to " << nf.run.export_path
                << std::endl;
    }
    if (outcome.summary.stopped_early && signals.signal() != 0)
      return apps::exit_signal_base + signals.signal();
  }
  return apps::exit_ok;
}

} // namespace

int main(int argc, char** argv) {
  apps::block_stop_signals();
  node_flags nf;
  CLI::App cli{"One node of a job that runs in several processes (the "
               "lowest rank hosts the coordinator). Rank and world size may "
               "come from "
               "Slurm, Open MPI or torchrun-style environments."};
  cli.add_option("--job", nf.job_path, "Job file (TOML)")
    ->required()
    ->check(CLI::ExistingFile);
  cli.add_option("--node-rank", nf.rank, "This node's rank")
    ->check(CLI::Range(0, 1 << 20));
  cli
    .add_option("--world-size", nf.world_size,
                "Number of nodes (default: the job's [[nodes]])")
    ->check(CLI::Range(1, 1 << 20));
  cli.add_option("--coordinator", nf.coordinator,
                 "HOST:PORT of the coordinator (rank 0 listens there; port 0 "
                 "picks one and prints it)");
  cli.add_option("--bind", nf.bind,
                 "Address this node's channels listen on (default: the "
                 "local address that routes to the coordinator)");
  cli.add_option("--secret-file", nf.secret_file,
                 "The job's secret (default: security.secret_file)");
  cli
    .add_option("--exclude-nodes", nf.exclude,
                "Ranks of failed nodes whose chips are unavailable: the job "
                "runs on the others, planned by HeteroAuto (a restart)")
    ->delimiter(',');
  cli
    .add_option("--restarts", nf.restarts,
                "Restarts of this job so far (h2-launch sets it; exported "
                "as h2_restarts_total)")
    ->check(CLI::Range(0, 1 << 20));
  apps::add_run_flags(cli, nf.run);
  cli
    .add_option("--test-fault", nf.test_fault,
                "Test only: OP computes wrongly (x 1.05) in the [ditorch] "
                "check")
    ->group(""); // hidden: not for users
  // h2-launch --nodes: this node ends when the launcher is gone.
  cli
    .add_option("--report-fd", nf.report_fd,
                "A pipe to h2-launch: JSON lines of where this node listens "
                "and its state (docs/cli.md)")
    ->check(CLI::NonNegativeNumber)
    ->group("");
  cli.add_option("--launcher-pid", nf.launcher_pid, "h2-launch's pid")
    ->check(CLI::PositiveNumber)
    ->group("");
  cli.add_option("--launcher-dir", nf.launcher_dir,
                 "h2-launch's temporary directory")
    ->group("");
  return apps::parse_and_run(cli, argc, argv, "h2-node", [&] {
    std::optional<apps::launcher_watch> launcher;
    if (nf.launcher_pid > 0)
      launcher.emplace(nf.launcher_pid, nf.launcher_dir);
    return run_node(nf);
  });
}
