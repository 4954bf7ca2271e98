// Jobs over several h2-node processes (docs/transport.md): h2-launch
// --nodes, h2-node started by hand or from a launcher's environment, and
// two network namespaces as two hosts. Every node is a real process; the
// failure tests kill or stop one with real signals.
#include "launch.hpp"
#include "process_status.hpp"
#include "test_jobs.hpp"

#include "h2/core/plan.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <netinet/in.h>
#include <regex>
#include <sstream>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace h2::test {
namespace {

using namespace std::chrono_literals;


/// The demo job (examples/demo.toml) on the virtual clock with its four
/// chips split over nodes as `nodes` says (TOML [[nodes]] tables).
std::string demo_job(const std::string& nodes) {
  return replaced(demo_job_with_nodes(H2_SOURCE_DIR, nodes),
                  "clock = \"wall\"", "clock = \"virtual\"");
}

class apps_cluster : public ::testing::Test {
protected:
  /// Runs h2-launch `args` to its end; fails the test unless it exits 0.
  run_result launch_ok(const std::vector<std::string>& args) {
    auto r = run_to_end(launch_binary, args, dir_, run_timeout);
    EXPECT_TRUE(r.status.exited && r.status.code == 0)
      << r.status.describe() << "\nstdout:\n"
      << r.out << "stderr:\n"
      << r.err;
    return r;
  }

  /// Trains `job` under `plan` for 4 steps on `nodes` h2-node processes
  /// ("1": one process), exporting to NAME.safetensors and logging to
  /// NAME.jsonl.
  run_result train_plan(const std::filesystem::path& job,
                        const std::filesystem::path& plan,
                        const std::string& nodes, const std::string& name) {
    std::vector<std::string> args = {
      job.string(),  "--plan",
      plan.string(), "--steps",
      "4",           "--no-metrics",
      "--export",    (dir_ / (name + ".safetensors")).string(),
      "--json-log",  (dir_ / (name + ".jsonl")).string()};
    if (nodes != "1")
      args.insert(args.end(), {"--nodes", nodes});
    return launch_ok(args);
  }

  /// Starts the small job over two nodes with steps enough to train until
  /// stopped, no metrics, and a JSON log (steps_logged()).
  std::unique_ptr<child_process> start_endless_job_on_two_nodes() {
    auto job = dir_.write("job.toml", small_job);
    return std::make_unique<child_process>(
      launch_binary,
      std::vector<std::string>{job.string(), "--nodes", "2", "--steps",
                               "1000000", "--no-metrics", "--json-log",
                               (dir_ / "log.jsonl").string()},
      dir_ / "stdout.txt", dir_ / "stderr.txt");
  }

  /// Steps in the JSON log of start_endless_job_on_two_nodes() so far.
  int steps_logged() const {
    return logged_steps(read_text(dir_ / "log.jsonl"));
  }

  /// Runs the small job over two nodes, sends `sig` to node `rank` once a
  /// few steps are logged, and returns h2-launch's stderr after checking
  /// that the run ended with exit code 3 (a lost peer).
  std::string fail_node(int rank, int sig) {
    auto started = start_endless_job_on_two_nodes();
    child_process& child = *started;
    EXPECT_TRUE(
      child.wait_until([&] { return steps_logged() >= 3; }, run_timeout))
      << child.err();
    pid_t victim = node_pid(child.pid(), rank);
    EXPECT_GT(victim, 0) << "no h2-node of rank " << rank;
    if (victim > 0)
      ::kill(victim, sig);
    auto status = child.wait(run_timeout);
    EXPECT_TRUE(status.exited && status.code == 3) << status.describe() << "\n"
                                                   << child.err();
    return child.err();
  }

  /// Starts h2-node rank 0 of a 2-node `job` (coordinator on any free
  /// port, stdout in out0.txt).
  std::unique_ptr<child_process>
  start_rank0(const std::filesystem::path& job,
              const std::filesystem::path& secret) {
    return std::make_unique<child_process>(
      node_binary,
      std::vector<std::string>{"--job", job.string(), "--node-rank", "0",
                               "--world-size", "2", "--coordinator",
                               "127.0.0.1:0", "--secret-file", secret.string(),
                               "--no-metrics"},
      dir_ / "out0.txt", dir_ / "err0.txt");
  }

  /// The job's secret, written privately into the test's directory.
  std::filesystem::path write_secret() {
    return dir_.write_private("secret", "0123456789abcdef0123456789abcdef");
  }

  scratch_dir dir_;
};

TEST_F(apps_cluster,
       a_hung_chip_is_reported_as_stalled_in_one_process_and_over_nodes) {
  // docs/cli.md, "Stalled chips": chip 1:0 hangs at step 2; the watchdog of
  // the process that runs it names it, and the run ends with exit code 1 in
  // h2-launch and over two h2-node processes alike.
  auto job = dir_.write("hang.toml",
                        small_job + "\n[watchdog]\nfloor_seconds = 0.5\n"
                                    "[[drills]]\nstep = 2\nhang = \"1:0\"\n");
  for (const std::string nodes : {"1", "2"}) {
    std::vector<std::string> args = {job.string(), "--no-metrics"};
    if (nodes != "1")
      args.insert(args.end(), {"--nodes", nodes});
    auto r = run_to_end(launch_binary, args, dir_, run_timeout);
    EXPECT_TRUE(r.status.exited && r.status.code == 1)
      << nodes << " node(s): " << r.status.describe() << "\n"
      << r.err;
    EXPECT_NE(r.err.find("chip 1:0 stalled: its "), std::string::npos)
      << nodes << " node(s):\n"
      << r.err;
  }
}

/// A connected socket to `addr` (sockaddr_in or abstract sockaddr_un), -1
/// when the connect fails.
int connect_silently(int family, const sockaddr* addr, socklen_t len) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, addr, len) == 0)
    return fd;
  if (fd >= 0)
    ::close(fd);
  return -1;
}

TEST_F(apps_cluster, a_node_survives_a_flood_of_silent_connections) {
  // Issue 13: 4,000 connections that never speak, to node 1's tcp and shm
  // listeners while the job trains. Its threads stay bounded (at most 64
  // handshakes at once per endpoint, docs/transport.md "Bounds"), and the
  // training goes on.
  constexpr int flood = 4000;
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, flood + 1000);
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ASSERT_GE(limit.rlim_cur, rlim_t{flood + 200}) << "needs descriptors";

  auto started = start_endless_job_on_two_nodes();
  child_process& child = *started;
  static const std::regex listening(
    R"(\[node 1\] h2: node 1 \(pid (\d+)\): channels listen on tcp ([0-9.]+):(\d+), shm @(\S+))");
  std::smatch m;
  std::string out;
  ASSERT_TRUE(child.wait_until(
    [&] {
      out = child.out();
      return std::regex_search(out, m, listening) && steps_logged() >= 2;
    },
    run_timeout))
    << child.out() << child.err();
  const pid_t node = std::stoi(m[1]);
  sockaddr_in tcp{};
  tcp.sin_family = AF_INET;
  tcp.sin_port = htons(static_cast<std::uint16_t>(std::stoi(m[3])));
  ASSERT_EQ(::inet_pton(AF_INET, std::string(m[2]).c_str(), &tcp.sin_addr), 1);
  const std::string shm_name = m[4];
  sockaddr_un shm{};
  shm.sun_family = AF_UNIX;
  std::memcpy(shm.sun_path + 1, shm_name.data(), shm_name.size());
  const auto shm_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) +
                                              1 + shm_name.size());

  const int before = threads_of(node);
  ASSERT_GT(before, 0);
  int most = before;
  std::vector<int> silent;
  for (int i = 0; i < flood; ++i) {
    const bool over_tcp = i % 2 == 0;
    int fd =
      over_tcp
        ? connect_silently(AF_INET, reinterpret_cast<sockaddr*>(&tcp),
                           sizeof(tcp))
        : connect_silently(AF_UNIX, reinterpret_cast<sockaddr*>(&shm), shm_len);
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    silent.push_back(fd);
    if (i % 50 == 0)
      most = std::max(most, threads_of(node));
  }
  // Training goes on under the flood: more steps are logged.
  const int steps = steps_logged();
  EXPECT_TRUE(child.wait_until(
    [&] {
      most = std::max(most, threads_of(node));
      return steps_logged() >= steps + 3;
    },
    run_timeout))
    << child.err();
  std::cout << "node 1: " << before << " threads before the flood, at most "
            << most << " during it\n";
  // Two listeners, 64 handshakes each at most, and a few of the runtime's
  // own that come and go.
  EXPECT_LE(most, before + 2 * 64 + 16)
    << "threads before the flood: " << before;
  for (int fd : silent)
    ::close(fd);
  child.send(SIGTERM); // a clean stop at the next step boundary
  auto status = child.wait(run_timeout);
  EXPECT_TRUE(status.exited && status.code == 128 + SIGTERM)
    << status.describe() << "\n"
    << child.err();
}

TEST_F(apps_cluster, demo_over_nodes_is_bitwise_the_single_process_run) {
  auto one = dir_.write("one.toml", demo_job(R"([[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x",
         "emulated:a100-sxm-40gb", "emulated:a100-sxm-40gb"]
)"));
  auto two = dir_.write("two.toml", demo_job(demo_on_two_nodes));
  auto four = dir_.write("four.toml", demo_job(demo_on_four_nodes));
  auto two_tcp =
    dir_.write("two-tcp.toml", demo_job(demo_on_two_nodes) +
                                 "\n[transport]\nbackend = \"tcp\"\n");

  auto run = [&](const std::filesystem::path& job, int nodes,
                 const std::string& name) {
    // 5 steps: the demo's live rebalancing moves layers before step 4 in
    // every run, by the same decision.
    std::vector<std::string> args = {
      job.string(), "--steps",
      "5",          "--no-metrics",
      "--export",   (dir_ / (name + ".safetensors")).string(),
      "--json-log", (dir_ / (name + ".jsonl")).string()};
    if (nodes > 1)
      args.insert(args.end(), {"--nodes", std::to_string(nodes)});
    return launch_ok(args);
  };
  run(one, 1, "one");
  auto r2 = run(two, 2, "two");
  EXPECT_NE(r2.out.find("h2: channel 0:1 <-> 1:0: shm"), std::string::npos)
    << r2.out;
  auto r4 = run(four, 4, "four");
  for (const char* link :
       {"0:0 <-> 1:0: shm", "1:0 <-> 2:0: shm", "2:0 <-> 3:0: shm"})
    EXPECT_NE(r4.out.find(link), std::string::npos) << link << "\n" << r4.out;
  auto rt = run(two_tcp, 2, "two-tcp");
  EXPECT_NE(rt.out.find("h2: channel 0:1 <-> 1:0: tcp (forced)"),
            std::string::npos)
    << rt.out;
  {
    // The environment overrides the job file.
    scoped_env env("H2_TRANSPORT", "tcp");
    auto r = run(four, 4, "four-tcp");
    EXPECT_NE(r.out.find("1:0 <-> 2:0: tcp (forced)"), std::string::npos)
      << r.out;
  }

  auto reference = logged_losses(dir_ / "one.jsonl");
  ASSERT_EQ(reference.size(), 5u);
  const auto params = read_text(dir_ / "one.safetensors");
  ASSERT_FALSE(params.empty());
  // The plans a run's rebalances moved to, without chip ids (they differ
  // between the node layouts).
  const auto rebalances_of = [&](const std::string& name) {
    auto out = events(json_log(read_text(dir_ / (name + ".jsonl"))),
                      "rebalance");
    for (auto& e : out)
      for (auto& r : e["plan"]["replicas"])
        for (auto& st : r["stages"])
          st.erase("chip");
    return out;
  };
  const auto moved = rebalances_of("one");
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0]["step"], 3);
  for (const char* name : {"two", "four", "two-tcp", "four-tcp"}) {
    EXPECT_EQ(logged_losses(dir_ / (std::string(name) + ".jsonl")), reference)
      << name;
    const auto r = rebalances_of(name);
    ASSERT_EQ(r.size(), 1u) << name;
    EXPECT_EQ(r[0]["plan"], moved[0]["plan"]) << name;
    EXPECT_TRUE(read_text(dir_ / (std::string(name) + ".safetensors")) ==
                params)
      << name << ": the trained parameters differ from the single process's";
  }
}

TEST_F(apps_cluster, replicas_on_two_nodes_equal_the_single_process_run) {
  // One pipeline per node: the gradients are all-reduced over shm. Under
  // zb-h1 (B and W split, W deferred) the nodes train bitwise as 1F1B in
  // one process: the same kernels, the same order of weight gradients.
  auto job = dir_.write("job.toml", small_job);
  auto plan = dir_.write("plan.json", two_replica_plan);
  auto zb = dir_.write("zb.json", replaced(two_replica_plan, "\"1f1b\"",
                                           "\"zb-h1\""));
  train_plan(job, plan, "1", "1");
  train_plan(job, plan, "2", "2");
  auto r = train_plan(job, zb, "2", "zb");
  EXPECT_NE(r.out.find("zb-h1 schedule"), std::string::npos) << r.out;
  EXPECT_EQ(logged_losses(dir_ / "1.jsonl").size(), 4u);
  // ZeRO-1 over the two nodes (docs/planner.md, "Sharded optimizer
  // state"): the gradients' reduce-scatter, the parameters' all-gather and
  // the moments' gather for the checkpoint saved at the end cross them.
  auto saving =
    dir_.write("saving.toml", small_job + "\n[checkpoint]\ndir = \"" +
                                (dir_ / "ck").string() + "\"\n");
  auto zero1 = dir_.write("zero1.json", replaced(two_replica_plan, "\"1f1b\"",
                                                 "\"1f1b\", \"zero1\": true"));
  train_plan(saving, plan, "1", "whole");
  std::filesystem::rename(dir_ / "ck", dir_ / "whole");
  train_plan(saving, zero1, "2", "zero1");
  for (const char* name : {"2", "zb", "zero1"}) {
    EXPECT_EQ(logged_losses(dir_ / "1.jsonl"),
              logged_losses(dir_ / (std::string(name) + ".jsonl")))
      << name;
    EXPECT_TRUE(read_text(dir_ / "1.safetensors") ==
                read_text(dir_ / (std::string(name) + ".safetensors")))
      << name;
  }
  // Every layer's state file holds the unsharded run's weights and whole
  // moments (its header names another run).
  auto tensors_of = [](const std::string& file) {
    std::uint64_t header = 0;
    std::memcpy(&header, file.data(), sizeof header); // little-endian
    return file.substr(sizeof header + header);
  };
  int layer_files = 0;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(dir_ / "whole")) {
    if (e.path().extension() != ".safetensors")
      continue;
    const auto twin =
      dir_ / "ck" / std::filesystem::relative(e.path(), dir_ / "whole");
    EXPECT_TRUE(tensors_of(read_text(e.path())) == tensors_of(read_text(twin)))
      << twin;
    ++layer_files;
  }
  EXPECT_EQ(layer_files, 6);
}

TEST_F(apps_cluster, interleaved_chunks_across_nodes_equal_one_process) {
  // interleaved-1f1b with two chunks on each of chips 0:0 and 1:0: every
  // chunk's neighbours are on the other node, so each micro-batch crosses
  // the nodes three times each way per step (plan format version 2).
  auto job = dir_.write("job.toml", small_job);
  auto plan = dir_.write("interleaved.json", R"({
  "format": "h2-plan", "version": 2, "schedule": "interleaved-1f1b",
  "replicas": [
    {"micro_batch_size": 2, "micro_batches": 4,
     "stages": [{"chip": "0:0", "layers": [0, 2]},
                {"chip": "1:0", "layers": [2, 3]},
                {"chip": "0:0", "layers": [3, 5]},
                {"chip": "1:0", "layers": [5, 6]}]}
  ]
})");
  auto one = train_plan(job, plan, "1", "1");
  EXPECT_NE(one.out.find("interleaved-1f1b schedule"), std::string::npos)
    << one.out;
  train_plan(job, plan, "2", "2");
  EXPECT_EQ(logged_losses(dir_ / "1.jsonl").size(), 4u);
  EXPECT_EQ(logged_losses(dir_ / "1.jsonl"), logged_losses(dir_ / "2.jsonl"));
  EXPECT_TRUE(read_text(dir_ / "1.safetensors") ==
              read_text(dir_ / "2.safetensors"));
}

TEST_F(apps_cluster, killed_node_is_reported_by_every_survivor) {
  auto err = fail_node(1, SIGKILL);
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(err.find("node 1 (chips 1:0, 1:1) is gone"), std::string::npos)
    << err;
  EXPECT_NE(err.find("h2-launch: node 1 was killed by signal 9\n"),
            std::string::npos)
    << err;
  for (const auto& marker : stack_trace_markers)
    EXPECT_EQ(err.find(marker), std::string::npos) << err;
  EXPECT_TRUE(shm_entries("h2").empty());
}

TEST_F(apps_cluster, stalled_node_is_detected_and_killed) {
  auto err = fail_node(1, SIGSTOP);
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(err.find("node 1 (chips 1:0, 1:1) stalled: no heartbeat for 5 s"),
            std::string::npos)
    << err;
  EXPECT_NE(err.find("h2-launch: node 1 was killed by signal 9 (by h2-launch)"),
            std::string::npos)
    << err;
}

TEST_F(apps_cluster, stalled_coordinator_is_detected_by_the_other_nodes) {
  auto err = fail_node(0, SIGSTOP);
  ASSERT_FALSE(HasFailure());
  EXPECT_NE(err.find("[node 1] h2-node: training failed (peer lost): the "
                     "coordinator (node 0, chips 0:0, 0:1) stalled"),
            std::string::npos)
    << err;
}

TEST_F(apps_cluster, every_node_serves_metrics_listed_in_file_sd) {
  auto job = dir_.write("job.toml", small_job);
  auto targets = dir_ / "targets.json";
  child_process child(launch_binary,
                      {job.string(), "--nodes", "2", "--steps", "1000000",
                       "--metrics-port", "0", "--metrics-targets",
                       targets.string()},
                      dir_ / "stdout.txt", dir_ / "stderr.txt");
  ASSERT_TRUE(child.wait_until(
    [&] {
      return step_lines(child.out()).size() >= 3 && !read_text(targets).empty();
    },
    run_timeout))
    << child.err();
  auto sd = nlohmann::json::parse(read_text(targets));
  ASSERT_EQ(sd.size(), 2u) << sd.dump();
  for (int rank = 0; rank < 2; ++rank) {
    const auto& entry = sd.at(static_cast<std::size_t>(rank));
    EXPECT_EQ(entry.at("labels").at("node"), std::to_string(rank));
    std::string target = entry.at("targets").at(0);
    int port = std::stoi(target.substr(target.rfind(':') + 1));
    std::string body;
    ASSERT_NO_THROW(body = http_get(port, "/metrics"));
    // Each node exports its own chips.
    std::string own = "chip=\"" + std::to_string(rank) + ":0\"";
    EXPECT_NE(body.find(own), std::string::npos) << "node " << rank << body;
    EXPECT_NE(body.find("\nh2_steps_total "), std::string::npos) << body;
  }
  child.send(SIGINT);
  auto status = child.wait(run_timeout);
  EXPECT_TRUE(status.exited && status.code == 130)
    << status.describe() << child.err();
}

TEST_F(apps_cluster, nodes_take_rank_and_coordinator_from_the_environment) {
  auto job = dir_.write("job.toml", small_job);
  auto secret = write_secret();
  child_process rank0(node_binary,
                      {"--job", job.string(), "--node-rank", "0",
                       "--world-size", "2", "--coordinator", "127.0.0.1:0",
                       "--secret-file", secret.string(), "--steps", "3",
                       "--no-metrics"},
                      dir_ / "out0.txt", dir_ / "err0.txt");
  const std::string coordinator = coordinator_of(rank0);
  ASSERT_FALSE(coordinator.empty()) << rank0.err();
  // torchrun's variables; Slurm's and Open MPI's are read the same way.
  scoped_env rank("RANK", "1"), world("WORLD_SIZE", "2"),
    addr("MASTER_ADDR", "127.0.0.1"),
    port("MASTER_PORT", coordinator.substr(coordinator.rfind(':') + 1));
  child_process rank1(node_binary,
                      {"--job", job.string(), "--secret-file", secret.string(),
                       "--steps", "3", "--no-metrics"},
                      dir_ / "out1.txt", dir_ / "err1.txt");
  auto s1 = rank1.wait(run_timeout);
  auto s0 = rank0.wait(run_timeout);
  EXPECT_TRUE(s0.exited && s0.code == 0) << s0.describe() << rank0.err();
  EXPECT_TRUE(s1.exited && s1.code == 0) << s1.describe() << rank1.err();
  EXPECT_EQ(step_lines(rank0.out()).size(), 3u) << rank0.out();
}

TEST_F(apps_cluster, a_node_without_the_secret_is_refused) {
  auto job = dir_.write("job.toml", small_job);
  auto secret = write_secret();
  auto wrong = dir_.write_private("wrong", "fedcba9876543210fedcba9876543210");
  auto started = start_rank0(job, secret);
  auto& rank0 = *started;
  const std::string coordinator = coordinator_of(rank0);
  ASSERT_FALSE(coordinator.empty()) << rank0.err();
  auto r = run_to_end(node_binary,
                      {"--job", job.string(), "--node-rank", "1",
                       "--world-size", "2", "--coordinator", coordinator,
                       "--secret-file", wrong.string(), "--no-metrics"},
                      dir_, run_timeout);
  ASSERT_TRUE(r.status.exited) << r.status.describe();
  EXPECT_NE(r.status.code, 0);
  expect_one_line(r.err);
  EXPECT_NE(r.err.find("does not know the job's secret"), std::string::npos)
    << r.err;
  // The coordinator still waits for a real node 1; nothing reached node 1.
  EXPECT_TRUE(rank0.running());
  EXPECT_TRUE(step_lines(rank0.out()).empty());
}

// [ditorch] check = true over two processes (docs/ditorch.md): node 1's
// chips fail the check (a test-only wrong layer_norm), so node 1 exits 4
// after telling the coordinator, which ends the job naming it at once
// rather than waiting for it to join.
TEST_F(apps_cluster, a_node_that_fails_its_operator_check_withdraws) {
  auto job = dir_.write("job.toml", small_job + "\n[ditorch]\ncheck = true\n");
  auto secret = write_secret();
  auto started = start_rank0(job, secret);
  auto& rank0 = *started;
  const std::string coordinator = coordinator_of(rank0);
  ASSERT_FALSE(coordinator.empty()) << rank0.err();
  auto r =
    run_to_end(node_binary,
               {"--job", job.string(), "--node-rank", "1", "--world-size", "2",
                "--coordinator", coordinator, "--secret-file", secret.string(),
                "--no-metrics", "--test-fault", "layer_norm"},
               dir_, run_timeout);
  EXPECT_TRUE(r.status.exited && r.status.code == 4)
    << r.status.describe() << "\n"
    << r.err;
  EXPECT_NE(r.out.find("1 of 12 operators failed: layer_norm"),
            std::string::npos)
    << r.out;
  auto s0 = rank0.wait(run_timeout);
  EXPECT_TRUE(s0.exited && s0.code == 3) << s0.describe() << "\n"
                                         << rank0.err();
  EXPECT_NE(rank0.err().find("node 1 (chips 1:0, 1:1) withdrew before "
                             "training: its chips failed the operator check "
                             "([ditorch] check)"),
            std::string::npos)
    << rank0.err();
  EXPECT_TRUE(step_lines(rank0.out()).empty());
}

/// Writes a test CA, a node certificate it signed (ca.pem, node.pem,
/// node.key) and a self-signed intruder (other.pem, other.key) into `dir`
/// with the openssl command line tool. False when it fails.
bool write_certificates(const scratch_dir& dir) {
  const std::string d = dir.path().string();
  const std::string quiet = " >/dev/null 2>&1";
  const std::string cmd =
    "cd '" + d +
    "' && openssl req -x509 -newkey rsa:2048 -nodes -keyout "
    "ca.key -out ca.pem -days 2 -subj /CN=h2-test-ca" +
    quiet +
    " && openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr "
    "-subj /CN=h2-node" +
    quiet +
    " && openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key "
    "-CAcreateserial -out node.pem -days 2" +
    quiet +
    " && openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out "
    "other.pem -days 2 -subj /CN=intruder" +
    quiet;
  return std::system(cmd.c_str()) == 0;
}

// [security] certificate/key/ca_file: the nodes' actor systems talk TLS
// with certificates checked against the CA (docs/transport.md, "TLS"). A
// client with a certificate the CA did not sign, or none, fails the TLS
// handshake with the coordinator before any actor message; a node with
// the CA's certificate joins and the job trains.
TEST_F(apps_cluster, nodes_talk_tls_and_refuse_certificates_of_another_ca) {
  ASSERT_TRUE(write_certificates(dir_)) << "openssl failed";
  const std::string d = dir_.path().string();
  auto job =
    dir_.write("job.toml", small_job + "\n[security]\ncertificate = \"" + d +
                             "/node.pem\"\nkey = \"" + d +
                             "/node.key\"\nca_file = \"" + d + "/ca.pem\"\n");
  auto secret = write_secret();
  auto started = start_rank0(job, secret);
  auto& rank0 = *started;
  const std::string coordinator = coordinator_of(rank0);
  ASSERT_FALSE(coordinator.empty()) << rank0.err();
  EXPECT_NE(rank0.out().find("over TLS"), std::string::npos) << rank0.out();
  auto handshake = [&](const std::string& cert) {
    std::string cmd = "openssl s_client -connect " + coordinator +
                      " -tls1_2 -CAfile '" + d +
                      "/ca.pem' -verify_return_error";
    if (!cert.empty())
      cmd +=
        " -cert '" + d + "/" + cert + ".pem' -key '" + d + "/" + cert + ".key'";
    cmd += " </dev/null >'" + d + "/s_client.txt' 2>&1";
    return std::system(cmd.c_str());
  };
  // The openssl tool completes a handshake only with the CA's certificate.
  EXPECT_NE(handshake("other"), 0) << read_text(dir_ / "s_client.txt");
  EXPECT_NE(handshake(""), 0) << read_text(dir_ / "s_client.txt");
  EXPECT_EQ(handshake("node"), 0) << read_text(dir_ / "s_client.txt");
  expect_rank1_trains_to_the_end(rank0, job, secret, coordinator, dir_);
}

// Issue 13, item 7: a secret others can read, or too short to resist a
// guess, is refused before anything starts (one line, exit 2).
TEST_F(apps_cluster, a_shared_or_short_secret_file_is_refused) {
  auto job = dir_.write("job.toml", small_job);
  const auto shared = dir_.write("shared", "0123456789abcdef0123456789abcdef");
  std::filesystem::permissions(shared, std::filesystem::perms::owner_read |
                                         std::filesystem::perms::owner_write |
                                         std::filesystem::perms::group_read);
  const auto short_secret = dir_.write_private("short", "0123456789");
  for (const auto& [file, reason] :
       std::vector<std::pair<std::filesystem::path, std::string>>{
         {shared, "readable by group or others"},
         {short_secret, "needs at least 16"}}) {
    auto r = run_to_end(node_binary,
                        {"--job", job.string(), "--node-rank", "0",
                         "--world-size", "2", "--coordinator", "127.0.0.1:0",
                         "--secret-file", file.string(), "--no-metrics"},
                        dir_, run_timeout);
    EXPECT_EQ(r.status.code, 2) << r.status.describe() << r.err;
    EXPECT_NE(r.err.find("security.secret_file"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(reason), std::string::npos) << r.err;
    expect_one_line(r.err);
  }
}

TEST_F(apps_cluster, layers_moved_live_over_two_nodes_train_as_if_not) {
  auto job = dir_.write("job.toml", small_job);
  // The job's plan is stages 0:0, 0:1, 1:0 holding [2, 3, 1] layers, 4
  // micro-batches of 2; the re-plans move layers across the node boundary.
  auto cut = [&](const std::string& name, std::vector<int> layers) {
    plan p;
    replica_plan r;
    const chip_id chips[] = {{0, 0}, {0, 1}, {1, 0}};
    int first = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      r.stages.push_back({chips[i], first, first + layers[i], false});
      first += layers[i];
    }
    r.micro_batch_size = 2;
    r.micro_batches = 4;
    p.replicas = {r};
    return dir_.write(name, to_json(p));
  };
  auto early = cut("early.json", {1, 3, 2});
  auto late = cut("late.json", {4, 1, 1});
  launch_ok({job.string(), "--steps", "6", "--no-metrics", "--json-log",
             (dir_ / "still.jsonl").string()});
  auto r = launch_ok({job.string(), "--nodes", "2", "--steps", "6",
                      "--no-metrics", "--replan", "2:" + early.string(),
                      "--replan", "4:" + late.string(), "--json-log",
                      (dir_ / "moved.jsonl").string()});
  EXPECT_NE(r.out.find("layers [ 0,  1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers [ 0,  4)"), std::string::npos) << r.out;
  const auto still = logged_losses(dir_ / "still.jsonl");
  EXPECT_EQ(still.size(), 6u);
  EXPECT_EQ(logged_losses(dir_ / "moved.jsonl"), still); // bitwise
  // The layers went chip to chip, across the node boundary too, and the
  // channels carried exactly their state.
  const auto moves =
    events(json_log(read_text(dir_ / "moved.jsonl")), "rebalance");
  ASSERT_EQ(moves.size(), 2u);
  for (const auto& e : moves) {
    EXPECT_EQ(e.at("route"), "chip to chip") << e.dump();
    EXPECT_EQ(e.at("sent_bytes").get<double>(),
              e.at("moved_bytes").get<double>())
      << e.dump();
  }
}

TEST_F(apps_cluster, nodes_that_see_other_checkpoint_directories_refuse) {
  // A relative checkpoint.dir and nodes in different working directories:
  // two directories, as unshared storage would give.
  auto job =
    dir_.write("job.toml", small_job + "\n[checkpoint]\ndir = \"ck\"\n");
  auto secret = write_secret();
  std::filesystem::create_directories(dir_ / "a");
  std::filesystem::create_directories(dir_ / "b");
  auto node_in = [&](const std::string& cwd, int rank,
                     const std::string& coordinator) {
    return std::vector<std::string>{
      "-c", "cd " + (dir_ / cwd).string() + " && exec " + node_binary +
              " --job " + job.string() + " --node-rank " +
              std::to_string(rank) + " --world-size 2 --coordinator " +
              coordinator + " --secret-file " + secret.string() +
              " --no-metrics -q"};
  };
  child_process rank0("/bin/sh", node_in("a", 0, "127.0.0.1:0"),
                      dir_ / "out0.txt", dir_ / "err0.txt");
  const std::string coordinator = coordinator_of(rank0);
  ASSERT_FALSE(coordinator.empty()) << rank0.err();
  child_process rank1("/bin/sh", node_in("b", 1, coordinator),
                      dir_ / "out1.txt", dir_ / "err1.txt");
  auto s1 = rank1.wait(run_timeout);
  auto s0 = rank0.wait(run_timeout);
  for (const auto& [s, err] :
       {std::pair{s0, rank0.err()}, {s1, rank1.err()}}) {
    EXPECT_TRUE(s.exited && s.code == 2) << s.describe() << err;
    expect_one_line(err);
    EXPECT_NE(err.find("node 1 does not see the directory the coordinator's "
                       "node writes checkpoints to"),
              std::string::npos)
      << err;
  }
  EXPECT_TRUE(step_lines(rank0.out()).empty());
}

TEST_F(apps_cluster, bad_node_flags_are_one_line_errors) {
  auto job = dir_.write("job.toml", small_job);
  auto secret = write_secret();
  struct bad_case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::vector<bad_case> cases = {
    {{"--job", job.string(), "--node-rank", "0", "--world-size", "2",
      "--coordinator", "127.0.0.1:0"},
     "security.secret_file"},
    {{"--job", job.string(), "--node-rank", "0", "--world-size", "2",
      "--coordinator", "nohostport", "--secret-file", secret.string()},
     "--coordinator"},
    {{"--job", job.string(), "--node-rank", "0", "--world-size", "3",
      "--coordinator", "127.0.0.1:0", "--secret-file", secret.string()},
     "--world-size"},
    {{"--job", job.string(), "--world-size", "2", "--coordinator",
      "127.0.0.1:0", "--secret-file", secret.string()},
     "--node-rank"},
  };
  for (const auto& c : cases) {
    auto r = run_to_end(node_binary, c.args, dir_, run_timeout);
    ASSERT_TRUE(r.status.exited) << r.status.describe();
    EXPECT_EQ(r.status.code, 2) << r.err;
    expect_one_line(r.err);
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
  }
  // An unknown backend in the environment is refused like a bad job key.
  scoped_env env("H2_TRANSPORT", "carrier-pigeon");
  auto r = run_to_end(node_binary,
                      {"--job", job.string(), "--node-rank", "0",
                       "--world-size", "2", "--coordinator", "127.0.0.1:0",
                       "--secret-file", secret.string()},
                      dir_, run_timeout);
  ASSERT_TRUE(r.status.exited) << r.status.describe();
  EXPECT_EQ(r.status.code, 2) << r.err;
  expect_one_line(r.err);
  EXPECT_NE(r.err.find("H2_TRANSPORT"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("carrier-pigeon"), std::string::npos) << r.err;
}

// Issue 13, item 6: start-up is bounded. small_job with a third node that
// holds no stage, so a job of three processes can miss one.
const std::string three_node_job =
  replaced(small_job, "\n[plan]\n",
           "\n[[nodes]]\nchips = [\"emulated:h100-sxm\"]\n\n[plan]\n");

class apps_cluster_start : public apps_cluster {
protected:
  /// Starts h2-node `rank` of three_node_job at `coordinator` (rank 0:
  /// "127.0.0.1:0", any free port) with `--join-timeout seconds`.
  std::unique_ptr<child_process> start_node(int rank,
                                            const std::string& coordinator,
                                            const std::string& seconds) {
    const auto r = std::to_string(rank);
    return std::make_unique<child_process>(
      node_binary,
      std::vector<std::string>{"--job", job_.string(), "--node-rank", r,
                               "--world-size", "3", "--coordinator",
                               coordinator, "--secret-file", secret_.string(),
                               "--join-timeout", seconds, "--no-metrics"},
      dir_ / ("out" + r + ".txt"), dir_ / ("err" + r + ".txt"));
  }

  std::filesystem::path job_ = dir_.write("job.toml", three_node_job);
  std::filesystem::path secret_ = write_secret();
};

TEST_F(apps_cluster_start, a_rank_that_never_joins_is_named_and_exits_3) {
  // Long enough for rank 1 to start and join on a loaded machine under the
  // sanitizers, where a node takes seconds to start.
  auto rank0 = start_node(0, "127.0.0.1:0", "10");
  const std::string coordinator = coordinator_of(*rank0);
  ASSERT_FALSE(coordinator.empty()) << rank0->err();
  auto rank1 = start_node(1, coordinator, "10");
  // Rank 2 is never started: ten seconds after the coordinator listens,
  // it names rank 2 and tells rank 1 why the job ends.
  auto s0 = rank0->wait(run_timeout);
  auto s1 = rank1->wait(run_timeout);
  EXPECT_NE(rank0->out().find("h2: node 1 joined"), std::string::npos)
    << rank0->out();
  for (const auto& [s, err] :
       {std::pair{s0, rank0->err()}, {s1, rank1->err()}}) {
    EXPECT_TRUE(s.exited && s.code == 3) << s.describe() << err;
    expect_one_line(err);
    EXPECT_NE(err.find("h2-node: training failed (peer lost): rank 2 of 3 "
                       "never joined within 10 s"),
              std::string::npos)
      << err;
  }
  EXPECT_TRUE(step_lines(rank0->out()).empty());
}

TEST_F(apps_cluster_start,
       a_joined_node_exits_when_the_coordinator_dies_before_the_start) {
  // A join timeout far beyond the test's kill-timeout: only the watch on
  // the coordinator can end rank 1 in time.
  auto rank0 = start_node(0, "127.0.0.1:0", "3600");
  const std::string coordinator = coordinator_of(*rank0);
  ASSERT_FALSE(coordinator.empty()) << rank0->err();
  auto rank1 = start_node(1, coordinator, "3600");
  ASSERT_TRUE(rank0->wait_until(
    [&] { return rank0->out().find("h2: node 1 joined") != std::string::npos; },
    run_timeout))
    << rank0->out() << rank0->err();
  rank0->send(SIGKILL); // the job has not started: rank 2 is missing
  auto s1 = rank1->wait(run_timeout);
  EXPECT_TRUE(s1.exited && s1.code == 3) << s1.describe() << rank1->err();
  expect_one_line(rank1->err());
  EXPECT_NE(rank1->err().find("lost the coordinator (node 0)"),
            std::string::npos)
    << rank1->err();
}

TEST_F(apps_cluster_start, a_node_that_cannot_reach_the_coordinator_exits_3) {
  // A port bound but not listening: every connection is refused.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string nowhere =
    "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto rank1 = start_node(1, nowhere, "1");
  auto s1 = rank1->wait(run_timeout);
  ::close(fd);
  EXPECT_TRUE(s1.exited && s1.code == 3) << s1.describe() << rank1->err();
  expect_one_line(rank1->err());
  EXPECT_NE(rank1->err().find("node 1: cannot reach the coordinator at " +
                              nowhere + " within 1 s"),
            std::string::npos)
    << rank1->err();
}

/// Two network namespaces joined by a veth pair: two hosts by the host
/// identity of docs/architecture.md (it includes the network namespace).
class two_hosts {
public:
  two_hosts() {
    const std::string tag = std::to_string(::getpid() % 100000);
    a_ = "h2a" + tag;
    b_ = "h2b" + tag;
    std::string cmds =
      "ip netns add " + a_ + " && ip netns add " + b_ + " && ip link add v" +
      a_ + " type veth peer name v" + b_ + " && ip link set v" + a_ +
      " netns " + a_ + " && ip link set v" + b_ + " netns " + b_ +
      " && ip -n " + a_ + " addr add 10.231.0.1/24 dev v" + a_ + " && ip -n " +
      b_ + " addr add 10.231.0.2/24 dev v" + b_ + " && ip -n " + a_ +
      " link set v" + a_ + " up && ip -n " + b_ + " link set v" + b_ +
      " up && ip -n " + a_ + " link set lo up && ip -n " + b_ +
      " link set lo up";
    ok_ = std::system(("(" + cmds + ") >/dev/null 2>&1").c_str()) == 0;
  }
  ~two_hosts() {
    std::system(("ip netns del " + a_ + " >/dev/null 2>&1; ip netns del " + b_ +
                 " >/dev/null 2>&1")
                  .c_str());
  }
  bool ok() const { return ok_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }

private:
  std::string a_, b_;
  bool ok_ = false;
};

TEST_F(apps_cluster, two_hosts_train_over_tcp) {
  two_hosts hosts;
  if (!hosts.ok())
    GTEST_SKIP() << "cannot create network namespaces here (needs root or "
                    "CAP_SYS_ADMIN and iproute2)";
  auto job = dir_.write("job.toml", small_job);
  auto secret = write_secret();
  child_process rank0("/usr/sbin/ip",
                      {"netns", "exec", hosts.a(), node_binary, "--job",
                       job.string(), "--node-rank", "0", "--world-size", "2",
                       "--coordinator", "10.231.0.1:0", "--secret-file",
                       secret.string(), "--steps", "3", "--no-metrics",
                       "--export", (dir_ / "hosts.safetensors").string()},
                      dir_ / "out0.txt", dir_ / "err0.txt");
  const std::string coordinator = coordinator_of(rank0);
  ASSERT_FALSE(coordinator.empty()) << rank0.err();
  child_process rank1("/usr/sbin/ip",
                      {"netns", "exec", hosts.b(), node_binary, "--job",
                       job.string(), "--node-rank", "1", "--world-size", "2",
                       "--coordinator", coordinator, "--secret-file",
                       secret.string(), "--steps", "3", "--no-metrics"},
                      dir_ / "out1.txt", dir_ / "err1.txt");
  auto s1 = rank1.wait(run_timeout);
  auto s0 = rank0.wait(run_timeout);
  ASSERT_TRUE(s0.exited && s0.code == 0) << s0.describe() << rank0.err();
  ASSERT_TRUE(s1.exited && s1.code == 0) << s1.describe() << rank1.err();
  // Different hosts: no shared memory between them, TCP.
  EXPECT_NE(rank0.out().find("h2: channel 0:1 <-> 1:0: tcp"), std::string::npos)
    << rank0.out();
  launch_ok({job.string(), "--steps", "3", "--no-metrics", "--export",
             (dir_ / "one.safetensors").string()});
  EXPECT_TRUE(read_text(dir_ / "hosts.safetensors") ==
              read_text(dir_ / "one.safetensors"));
}

} // namespace
} // namespace h2::test
