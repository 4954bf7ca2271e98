// The demo's step time on the wall clock (issue 3): one process against the
// same four chips split over 2 and 4 h2-node processes, over shm and over
// tcp. Runs the real binaries (h2-launch, h2-node) and reads their JSON
// logs; the first steps (warm-up) are left out.
#include "bench_common.hpp"
#include "h2/core/files.hpp"
#include "test_jobs.hpp" // the demo split over nodes, as the tests split it

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace h2::bench {
namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The demo job with its [[nodes]] replaced by `nodes` (empty: as is).
std::string demo_with(const std::string& nodes) {
  return test::demo_job_with_nodes(H2_SOURCE_DIR, nodes);
}

/// Median wall seconds per step of the demo over `nodes` processes, steps
/// after the first `warm`.
double step_seconds(const std::filesystem::path& dir, const std::string& name,
                    const std::string& job_text, int nodes,
                    const std::string& transport, int steps, int warm) {
  auto job = dir / (name + ".toml");
  std::ofstream(job) << job_text;
  auto log = dir / (name + ".jsonl");
  std::string cmd;
  if (!transport.empty())
    cmd += "H2_TRANSPORT=" + transport + " ";
  cmd += std::string(H2_LAUNCH) + " " + job.string() + " --quiet --no-metrics" +
         " --steps " + std::to_string(steps) + " --json-log " + log.string();
  if (nodes > 1)
    cmd += " --nodes " + std::to_string(nodes);
  cmd += " > " + (dir / (name + ".out")).string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  H2_ENFORCE(rc == 0,
             "the run failed: " + cmd + "\n" + read_all(dir / (name + ".out")));
  std::vector<double> xs;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("event", "") == "step" && j.at("step").get<int>() >= warm)
      xs.push_back(j.at("wall_step_seconds").get<double>());
  }
  return quantile(xs, 0.5);
}

} // namespace
} // namespace h2::bench

int main(int argc, char** argv) {
  using namespace h2::bench;
  namespace fs = std::filesystem;
  auto dir = fs::temp_directory_path() /
             ("h2-bench-nodes-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const int steps = 12, warm = 2;
  std::vector<record> out;
  auto add = [&](record r) {
    print(r);
    out.push_back(std::move(r));
  };
  double one = step_seconds(dir, "one", demo_with(""), 1, "", steps, warm);
  add({"demo_step_1_process", one, "s", one, 1.0, "wall clock, median"});
  struct config {
    std::string name;
    const std::string* nodes;
    int count;
    std::string transport;
  };
  const auto* two = &h2::test::demo_on_two_nodes;
  const auto* four = &h2::test::demo_on_four_nodes;
  for (const auto& c : {config{"2_nodes_shm", two, 2, "shm"},
                        config{"4_nodes_shm", four, 4, "shm"},
                        config{"2_nodes_tcp", two, 2, "tcp"},
                        config{"4_nodes_tcp", four, 4, "tcp"}}) {
    double s = step_seconds(dir, c.name, demo_with(*c.nodes), c.count,
                            c.transport, steps, warm);
    add({"demo_step_" + c.name, s, "s", one, s / one,
         "baseline: the same chips in one process"});
  }
  h2::remove_tree(dir);
  if (auto path = out_path(argc, argv); !path.empty())
    append_results(path, out);
  return 0;
}
