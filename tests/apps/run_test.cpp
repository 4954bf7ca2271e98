// A good small job end to end: progress lines, JSON log, trace, --plan.
#include "launch.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <regex>
#include <set>

namespace h2::test {
namespace {

using nlohmann::json;

/// One "h2:   stage ..." setup line.
struct stage_line {
  int stage = -1;
  std::string chip;
  std::string dtype;
  int first = -1;
  int end = -1;
  bool recompute = false;
};

std::vector<stage_line> stage_lines(const std::string& out) {
  static const std::regex re(
    R"(^h2:\s+stage (\d+)\s+chip (\S+)\s+\S+\s+)"
    R"((\S+)\s+layers \[\s*(\d+),\s*(\d+)\)( recompute)?)");
  std::vector<stage_line> stages;
  for (auto& line : lines_of(out)) {
    std::smatch m;
    if (std::regex_search(line, m, re))
      stages.push_back({std::stoi(m[1]), m[2], m[3], std::stoi(m[4]),
                        std::stoi(m[5]), m[6].matched});
  }
  return stages;
}

bool finite_number(const json& j) {
  return j.is_number() && std::isfinite(j.get<double>());
}

/// Checks one "step" object of the JSON log against the documented fields
/// (apps/reporter.cpp) and the chips of the plan.
void check_step_event(const json& j, int step,
                      const std::map<std::string, int>& stage_of) {
  SCOPED_TRACE("step event " + j.dump());
  EXPECT_EQ(j.value("step", -1), step);
  bool complete = true;
  for (const char* key :
       {"loss", "lr", "grad_norm", "tokens_per_second", "step_seconds",
        "virtual_step_seconds", "wall_step_seconds", "pipeline_seconds",
        "bubble_fraction"}) {
    bool ok = j.contains(key) && finite_number(j[key]);
    EXPECT_TRUE(ok) << key;
    complete = complete && ok;
  }
  if (!complete)
    return;
  EXPECT_GT(j["loss"].get<double>(), 0);
  EXPECT_GT(j["lr"].get<double>(), 0);
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  EXPECT_GT(j["step_seconds"].get<double>(), 0);
  EXPECT_GE(j["bubble_fraction"].get<double>(), 0);
  EXPECT_LT(j["bubble_fraction"].get<double>(), 1);
  // Virtual clock: the run clock is the virtual one.
  EXPECT_EQ(j["step_seconds"].get<double>(),
            j["virtual_step_seconds"].get<double>());
  ASSERT_TRUE(j.contains("chips") && j["chips"].is_array());
  std::set<std::string> seen;
  for (const auto& c : j["chips"]) {
    ASSERT_TRUE(c.contains("chip") && c["chip"].is_string()) << c.dump();
    std::string id = c["chip"];
    seen.insert(id);
    ASSERT_EQ(stage_of.count(id), 1u) << "chip not in the plan: " << id;
    EXPECT_EQ(c.value("stage", -1), stage_of.at(id)) << id;
    for (const char* key :
         {"forward_seconds", "backward_seconds", "optimizer_seconds",
          "idle_seconds", "bubble_fraction", "memory_used_bytes",
          "memory_peak_bytes", "memory_capacity_bytes", "overruns"})
      ASSERT_TRUE(c.contains(key) && finite_number(c[key]))
        << id << ": " << key;
    EXPECT_GT(c["forward_seconds"].get<double>(), 0) << id;
    EXPECT_GT(c["backward_seconds"].get<double>(), 0) << id;
    EXPECT_GT(c["optimizer_seconds"].get<double>(), 0) << id;
    EXPECT_GE(c["idle_seconds"].get<double>(), 0) << id;
    EXPECT_GE(c["bubble_fraction"].get<double>(), 0) << id;
    EXPECT_LT(c["bubble_fraction"].get<double>(), 1) << id;
    EXPECT_GT(c["memory_used_bytes"].get<double>(), 0) << id;
    EXPECT_LE(c["memory_used_bytes"].get<double>(),
              c["memory_peak_bytes"].get<double>())
      << id;
    EXPECT_LE(c["memory_peak_bytes"].get<double>(),
              c["memory_capacity_bytes"].get<double>())
      << id;
    EXPECT_EQ(c["overruns"].get<double>(), 0) << id << " (virtual clock)";
  }
  EXPECT_EQ(seen.size(), stage_of.size()) << "every chip of the plan";
}

class apps_run : public ::testing::Test {
protected:
  scratch_dir dir_;
};

TEST_F(apps_run, progress_lines_json_log_and_trace) {
  auto job = dir_.write("job.toml", small_job);
  auto log = dir_ / "log.jsonl";
  auto trace = dir_ / "trace.json";
  auto r = run_to_end(
    launch_binary,
    {job.string(), "--json-log", log.string(), "--trace", trace.string()}, dir_,
    run_timeout);
  ASSERT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\nstderr:\n"
    << r.err << "\nstdout:\n"
    << r.out;
  EXPECT_EQ(r.err, "");
  // No metrics or admin port: nothing serves the live page, and nothing
  // says it does.
  EXPECT_EQ(r.out.find("live page"), std::string::npos) << r.out;

  // Setup report: the job's manual plan.
  EXPECT_NE(r.out.find("h2: job \"e2e\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1f1b schedule, virtual clock"), std::string::npos)
    << r.out;
  EXPECT_NE(r.out.find("h2: replica 0: 4 micro-batches of 2 sequences"),
            std::string::npos)
    << r.out;
  auto stages = stage_lines(r.out);
  ASSERT_EQ(stages.size(), 3u) << r.out;
  const std::vector<std::tuple<std::string, int, int>> want = {
    {"0:0", 0, 2}, {"0:1", 2, 5}, {"1:0", 5, 6}};
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(stages[s].stage, s);
    EXPECT_EQ(stages[s].chip, std::get<0>(want[s]));
    EXPECT_EQ(stages[s].first, std::get<1>(want[s]));
    EXPECT_EQ(stages[s].end, std::get<2>(want[s]));
    EXPECT_FALSE(stages[s].recompute);
  }

  // One progress line per step, in order.
  auto steps = step_lines(r.out);
  ASSERT_EQ(steps.size(), 20u) << r.out;
  for (int i = 0; i < 20; ++i) {
    char prefix[32];
    std::snprintf(prefix, sizeof(prefix), "step %5d/20 | loss ", i + 1);
    EXPECT_EQ(steps[i].rfind(prefix, 0), 0u) << steps[i];
  }
  int eval_lines = 0;
  for (auto& line : lines_of(r.out))
    eval_lines += line.rfind("eval after step ", 0) == 0;
  EXPECT_EQ(eval_lines, 4) << r.out;
  EXPECT_NE(r.out.find("h2: done after 20 steps"), std::string::npos) << r.out;

  // JSON log: 20 steps, an eval every 5 steps, a summary last.
  std::string log_text = read_text(log);
  ASSERT_FALSE(log_text.empty());
  EXPECT_EQ(log_text.back(), '\n');
  auto entries = json_log(log_text);
  auto step_events = events(entries, "step");
  auto eval_events = events(entries, "eval");
  auto summaries = events(entries, "summary");
  EXPECT_EQ(step_events.size() + eval_events.size() + summaries.size(),
            entries.size())
    << "only step, eval and summary events";
  ASSERT_EQ(step_events.size(), 20u);
  const std::map<std::string, int> stage_of = {
    {"0:0", 0}, {"0:1", 1}, {"1:0", 2}};
  for (int i = 0; i < 20; ++i)
    check_step_event(step_events[i], i, stage_of);
  ASSERT_EQ(eval_events.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(eval_events[i].value("step", -1), 5 * i + 4);
    ASSERT_TRUE(finite_number(eval_events[i]["val_loss"]));
    EXPECT_GT(eval_events[i]["val_loss"].get<double>(), 0);
  }
  ASSERT_EQ(summaries.size(), 1u);
  const json& summary = entries.back();
  ASSERT_EQ(summary.value("event", ""), "summary") << "the summary is last";
  EXPECT_EQ(summary.value("steps", -1), 20);
  EXPECT_EQ(summary.value("stopped_early", true), false);
  EXPECT_EQ(summary.value("final_loss", -1.0),
            step_events.back()["loss"].get<double>());
  EXPECT_EQ(summary.value("final_val_loss", -1.0),
            eval_events.back()["val_loss"].get<double>());
  for (const char* key :
       {"mean_step_seconds", "tokens_per_second", "mean_bubble_fraction",
        "virtual_seconds", "wall_seconds"})
    EXPECT_TRUE(summary.contains(key) && finite_number(summary[key])) << key;
  // It learns: the Markov source is far from uniform.
  EXPECT_LT(step_events.back()["loss"].get<double>(),
            step_events.front()["loss"].get<double>());

  // Trace: valid JSON; every chip of the plan ran forward and backward of
  // every micro-batch of every step.
  json t;
  ASSERT_NO_THROW(t = json::parse(read_text(trace)));
  ASSERT_TRUE(t.contains("traceEvents") && t["traceEvents"].is_array());
  std::map<std::pair<int, int>, std::map<std::string, int>> count;
  for (const auto& e : t["traceEvents"]) {
    if (e.value("ph", "") != "X")
      continue;
    EXPECT_GE(e.value("dur", -1.0), 0) << e.dump();
    EXPECT_GE(e.value("ts", -1.0), 0) << e.dump();
    ++count[{e.value("pid", -1), e.value("tid", -1)}][e.value("name", "")];
  }
  for (auto [node, index] :
       std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}}) {
    SCOPED_TRACE("chip " + std::to_string(node) + ":" + std::to_string(index));
    EXPECT_EQ((count[{node, index}]["forward"]), 20 * 4);
    EXPECT_EQ((count[{node, index}]["backward"]), 20 * 4);
    EXPECT_EQ((count[{node, index}]["optimizer"]), 20);
  }
  EXPECT_EQ(count.count({1, 1}), 0u) << "1:1 holds no stage";
  EXPECT_NE(r.out.find("trace written to"), std::string::npos);
}

TEST_F(apps_run, quiet_prints_no_progress_lines) {
  auto job = dir_.write("job.toml", small_job);
  auto r = run_to_end(launch_binary, {job.string(), "-q", "--steps", "3"}, dir_,
                      run_timeout);
  ASSERT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\n"
    << r.err;
  EXPECT_TRUE(step_lines(r.out).empty()) << r.out;
  EXPECT_NE(r.out.find("h2: done after 3 steps"), std::string::npos) << r.out;
}

TEST_F(apps_run, virtual_clock_runs_are_identical) {
  auto job = dir_.write("job.toml", small_job);
  std::vector<std::vector<json>> runs;
  for (int i = 0; i < 2; ++i) {
    auto log = dir_ / ("log" + std::to_string(i) + ".jsonl");
    auto r = run_to_end(
      launch_binary,
      {job.string(), "--steps", "5", "-q", "--json-log", log.string()}, dir_,
      run_timeout);
    ASSERT_TRUE(r.status.exited && r.status.code == 0)
      << r.status.describe() << "\n"
      << r.err;
    runs.push_back(events(json_log(read_text(log)), "step"));
  }
  ASSERT_EQ(runs[0].size(), 5u);
  ASSERT_EQ(runs[1].size(), 5u);
  for (std::size_t i = 0; i < 5; ++i)
    for (const char* key :
         {"loss", "grad_norm", "virtual_step_seconds", "bubble_fraction"})
      EXPECT_EQ(runs[0][i][key], runs[1][i][key]) << "step " << i << " " << key;
}

class apps_plan : public ::testing::Test {
protected:
  scratch_dir dir_;
};

TEST_F(apps_plan, plan_file_is_honoured) {
  // Other chips, other layer ranges, other micro-batching and schedule than
  // the job's [plan]: the run must follow the file.
  auto job = dir_.write("job.toml", small_job);
  auto plan = dir_.write("plan.json", R"({
  "format": "h2-plan",
  "version": 1,
  "schedule": "gpipe",
  "replicas": [
    {"micro_batch_size": 4, "micro_batches": 2,
     "stages": [{"chip": "1:1", "layers": [0, 3], "recompute": true},
                {"chip": "0:1", "layers": [3, 4]},
                {"chip": "0:0", "layers": [4, 6], "recompute": false}]}
  ]
}
)");
  auto log = dir_ / "log.jsonl";
  auto r = run_to_end(launch_binary,
                      {job.string(), "--plan", plan.string(), "--steps", "4",
                       "--json-log", log.string()},
                      dir_, run_timeout);
  ASSERT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\nstderr:\n"
    << r.err;
  EXPECT_NE(r.out.find("gpipe schedule"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("h2: replica 0: 2 micro-batches of 4 sequences"),
            std::string::npos)
    << r.out;
  auto stages = stage_lines(r.out);
  ASSERT_EQ(stages.size(), 3u) << r.out;
  EXPECT_EQ(stages[0].chip, "1:1");
  EXPECT_EQ(stages[0].dtype, "fp32");
  EXPECT_EQ(stages[0].first, 0);
  EXPECT_EQ(stages[0].end, 3);
  EXPECT_TRUE(stages[0].recompute);
  EXPECT_EQ(stages[1].chip, "0:1");
  EXPECT_EQ(stages[1].first, 3);
  EXPECT_EQ(stages[1].end, 4);
  EXPECT_FALSE(stages[1].recompute);
  EXPECT_EQ(stages[2].chip, "0:0");
  EXPECT_EQ(stages[2].first, 4);
  EXPECT_EQ(stages[2].end, 6);
  EXPECT_FALSE(stages[2].recompute);
  EXPECT_EQ(step_lines(r.out).size(), 4u) << r.out;
  auto step_events = events(json_log(read_text(log)), "step");
  ASSERT_EQ(step_events.size(), 4u);
  const std::map<std::string, int> stage_of = {
    {"1:1", 0}, {"0:1", 1}, {"0:0", 2}};
  for (int i = 0; i < 4; ++i)
    check_step_event(step_events[i], i, stage_of);
}

TEST_F(apps_plan, two_heterogeneous_replicas_train) {
  // Data parallelism over two heterogeneous pipelines (docs/architecture.md: replicas
  // may differ in chips and micro-batch counts).
  auto job = dir_.write("job.toml", small_job);
  auto plan = dir_.write("plan.json", two_replica_plan);
  auto r = run_to_end(launch_binary,
                      {job.string(), "--plan", plan.string(), "--steps", "3"},
                      dir_, std::chrono::seconds(60));
  ASSERT_FALSE(r.status.timed_out)
    << "h2-launch hung on a two-replica plan (killed after 60 s); "
       "stdout:\n"
    << r.out << "stderr:\n"
    << r.err;
  ASSERT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\n"
    << r.err;
  EXPECT_EQ(step_lines(r.out).size(), 3u) << r.out;
  EXPECT_NE(r.out.find("h2: replica 1: 4 micro-batches of 1 sequences"),
            std::string::npos)
    << r.out;
}

} // namespace
} // namespace h2::test

namespace h2::test {
namespace {

TEST(apps_auto, auto_plan_is_trained_and_measured_against_its_prediction) {
  scratch_dir dir;
  std::string job =
    read_text(std::string(H2_SOURCE_DIR) + "/examples/demo.toml");
  job = replaced(job, "clock = \"wall\"", "clock = \"virtual\"");
  job = replaced(job, "mode = \"even\"", "mode = \"auto\"");
  auto path = dir.write("auto.toml", job);
  auto r = run_to_end(launch_binary,
                      {path.string(), "--steps", "2", "--no-metrics",
                       "--json-log", (dir / "log.jsonl").string()},
                      dir, run_timeout);
  ASSERT_TRUE(r.status.exited && r.status.code == 0)
    << r.status.describe() << "\n"
    << r.err;
  EXPECT_NE(r.out.find("h2: HeteroAuto: predicted step"), std::string::npos)
    << r.out;
  EXPECT_NE(r.out.find("binding stage"), std::string::npos) << r.out;
  // The virtual clock runs exactly what the simulator predicts.
  auto summary = events(json_log(read_text(dir / "log.jsonl")), "summary");
  ASSERT_EQ(summary.size(), 1u);
  double predicted = summary[0].at("predicted_step_seconds").get<double>();
  double measured = summary[0].at("mean_step_seconds").get<double>();
  EXPECT_NEAR(measured / predicted, 1.0, 0.1);
  EXPECT_NE(r.out.find("against HeteroAuto's predicted"), std::string::npos)
    << r.out;
}

} // namespace
} // namespace h2::test
