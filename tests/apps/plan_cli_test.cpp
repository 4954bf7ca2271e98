// h2-plan end to end: the table, --json accepted by plan_from_json and
// validate_plan (what h2-launch --plan reads), --svg and --trace files,
// --compare, and bad input: exit code 2 and one line.
#include "launch.hpp"

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

namespace h2::test {
namespace {

inline const std::string plan_binary = H2_PLAN;
constexpr std::chrono::seconds plan_timeout{120};

run_result run_plan(const scratch_dir& dir, std::vector<std::string> args) {
  return run_to_end(plan_binary, args, dir, plan_timeout);
}

TEST(apps_plan_cli, prints_the_plan_and_why) {
  scratch_dir dir;
  auto job = dir.write("job.toml", small_job);
  auto r = run_plan(dir, {job.string()});
  ASSERT_EQ(r.status.code, 0) << r.status.describe() << "\n" << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* needle :
       {"h2-plan: job \"e2e\"", "replica 0:", "stage", "0:0",
        "emulated:h100-sxm", "predicted step", "tokens/s", "bubble",
        "why:", "binding stage", "memory: tightest chip", "proven optimal"})
    EXPECT_NE(r.out.find(needle), std::string::npos)
      << "missing '" << needle << "' in:\n"
      << r.out;
}

// Issue 24: a job name with terminal escape sequences is printed escaped
// (the OSC sequence would set the terminal's title), and so are errors.
TEST(apps_plan_cli, names_print_escaped) {
  scratch_dir dir;
  auto job = dir.write(
    "job.toml", replaced(small_job, "name = \"e2e\"",
                         "name = \"e2e\\u001b]0;pwned\\u0007\""));
  auto r = run_plan(dir, {job.string()});
  ASSERT_EQ(r.status.code, 0) << r.status.describe() << "\n" << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("h2-plan: job \"e2e\\x1b]0;pwned\\x07\""),
            std::string::npos)
    << r.out;
  auto bad = dir.write("bad.toml", replaced(small_job, "source = \"markov\"",
                                            "source = \"\\u001b[2J\""));
  r = run_plan(dir, {bad.string()});
  EXPECT_EQ(r.status.code, 2) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\\x1b[2J"), std::string::npos) << r.err;
}

TEST(apps_plan_cli, json_is_a_plan_h2_launch_accepts) {
  scratch_dir dir;
  auto job_path = dir.write("job.toml", small_job);
  auto r = run_plan(dir, {job_path.string(), "--json"});
  ASSERT_EQ(r.status.code, 0) << r.status.describe() << "\n" << r.err;
  auto job = parse_job(small_job, "job.toml");
  plan p = plan_from_json(r.out, "stdout");
  validate_plan(p, job, "stdout");
  EXPECT_EQ(p.schedule, schedule_kind::one_f_one_b); // the job's schedule
  // Options reach the plan.
  auto g = run_plan(dir, {job_path.string(), "--json", "--schedule", "gpipe",
                          "--max-replicas", "1", "--micro-batch", "2"});
  ASSERT_EQ(g.status.code, 0) << g.err;
  plan q = plan_from_json(g.out, "stdout");
  validate_plan(q, job, "stdout");
  EXPECT_EQ(q.schedule, schedule_kind::gpipe);
  ASSERT_EQ(q.replicas.size(), 1u);
  EXPECT_EQ(q.replicas[0].micro_batch_size, 2);
  // h2-launch trains with it.
  auto plan_path = dir.write("plan.json", g.out);
  auto log = dir / "log.jsonl";
  auto run =
    run_to_end(launch_binary,
               {job_path.string(), "--plan", plan_path.string(), "--steps", "2",
                "--json-log", log.string(), "--no-metrics", "-q"},
               dir, run_timeout);
  ASSERT_TRUE(run.status.exited && run.status.code == 0)
    << run.status.describe() << "\n"
    << run.err;
  EXPECT_NE(run.out.find("gpipe schedule"), std::string::npos) << run.out;
  EXPECT_EQ(logged_steps(read_text(log)), 2);
}

TEST(apps_plan_cli, svg_and_trace_files) {
  scratch_dir dir;
  auto job = dir.write("job.toml", small_job);
  auto svg = dir / "plan.svg";
  auto trace = dir / "plan.trace.json";
  auto r = run_plan(
    dir, {job.string(), "--svg", svg.string(), "--trace", trace.string()});
  ASSERT_EQ(r.status.code, 0) << r.err;
  // SVG: one document, a row label per chip of the plan, coloured bars.
  std::string s = read_text(svg);
  EXPECT_EQ(s.rfind("<?xml", 0), 0u);
  EXPECT_NE(s.find("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            std::string::npos);
  EXPECT_EQ(s.find("</svg>"), s.size() - 7);
  EXPECT_NE(s.find("#4e79a7"), std::string::npos); // forward
  EXPECT_NE(s.find("#f28e2b"), std::string::npos); // backward
  auto json = dir.write("p.json", run_plan(dir, {job.string(), "--json"}).out);
  plan p = plan_from_json(read_text(json), "p.json");
  for (const auto& rep : p.replicas)
    for (const auto& st : rep.stages)
      EXPECT_NE(
        s.find(std::string(">").append(st.chip.to_string()).append(" ")),
        std::string::npos)
        << st.chip.to_string();
  std::size_t opened = 0, closed = 0;
  for (std::size_t at = s.find("<rect"); at != std::string::npos;
       at = s.find("<rect", at + 1))
    ++opened;
  for (std::size_t at = s.find("/>"); at != std::string::npos;
       at = s.find("/>", at + 1))
    ++closed;
  for (std::size_t at = s.find("</rect>"); at != std::string::npos;
       at = s.find("</rect>", at + 1))
    ++closed;
  EXPECT_GT(opened, 10u);
  EXPECT_GE(closed, opened); // every rect closed (lines close with /> too)
  // Trace: Chrome trace JSON with a complete event per forward and backward
  // of every stage and micro-batch.
  auto t = nlohmann::json::parse(read_text(trace));
  ASSERT_TRUE(t.contains("traceEvents"));
  std::set<std::string> names;
  int computes = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") {
      names.insert(e["cat"].get<std::string>());
      EXPECT_GE(e["dur"].get<double>(), 0);
      if (e["cat"] == "forward" || e["cat"] == "backward")
        ++computes;
    }
  }
  EXPECT_TRUE(names.count("forward") && names.count("backward") &&
              names.count("optimizer"));
  int expected = 0;
  for (const auto& rep : p.replicas)
    expected += 2 * rep.micro_batches * static_cast<int>(rep.stages.size());
  EXPECT_EQ(computes, expected);
}

TEST(apps_plan_cli, compare_and_candidates) {
  scratch_dir dir;
  auto job = dir.write("job.toml", small_job);
  auto r = run_plan(dir, {job.string(), "--compare", "--candidates"});
  ASSERT_EQ(r.status.code, 0) << r.err;
  for (const char* needle :
       {"schedules (predicted, each planned by HeteroAuto):", "  gpipe ",
        "  1f1b ", "  zb-h1 ", "compare (predicted):", "auto (this plan)",
        "even (4 stages", "homogeneous h100-sxm/bf16 (1 chip",
        "homogeneous mi250x/bf16", "      plan: 1 x [", "      binds: ",
        "super-linear ratio:", "layouts (stage 1), fastest first:"})
    EXPECT_NE(r.out.find(needle), std::string::npos)
      << "missing '" << needle << "' in:\n"
      << r.out;
}

// --schedule auto plans every schedule and keeps the fastest: the first row
// of --compare's table of schedules.
TEST(apps_plan_cli, schedule_auto_keeps_the_fastest) {
  scratch_dir dir;
  auto job = dir.write("job.toml", small_job);
  auto r = run_plan(dir, {job.string(), "--schedule", "auto", "--compare"});
  ASSERT_EQ(r.status.code, 0) << r.err;
  const auto table = r.out.find("schedules (predicted");
  ASSERT_NE(table, std::string::npos) << r.out;
  // The header row, then the fastest schedule's row.
  auto row = r.out.find('\n', r.out.find('\n', table) + 1) + 1;
  std::istringstream first(r.out.substr(row, r.out.find('\n', row) - row));
  std::string fastest;
  first >> fastest;
  EXPECT_NE(r.out.find(", " + fastest + ", "), std::string::npos)
    << "the plan's schedule is not " << fastest << ":\n"
    << r.out;
  EXPECT_NE(r.out.find(" 1.000\n", row), std::string::npos) << r.out;
}

// With bf16 reductions ZeRO-1 is weighed against the plan without it: on
// the islands (memory to spare) the unsharded plan is faster, on the
// memory-bound superlinear example the sharded one (docs/planner.md,
// "Sharded optimizer state").
TEST(apps_plan_cli, zero1_is_weighed_with_bf16_reductions) {
  scratch_dir dir;
  for (const auto& [name, verdict] :
       {std::pair{"hetero-islands.toml", "ZeRO-1: off: "},
        std::pair{"superlinear.toml", "ZeRO-1: on: "}}) {
    SCOPED_TRACE(name);
    std::ifstream in(std::string(H2_SOURCE_DIR) + "/examples/" + name);
    std::stringstream text;
    text << in.rdbuf();
    std::string toml = text.str();
    const auto plan = toml.find("[plan]\n");
    ASSERT_NE(plan, std::string::npos);
    toml.insert(plan + 7, "zero1 = true\n");
    toml += "\n[transport]\nreduce_dtype = \"bf16\"\n";
    auto r = run_plan(dir, {dir.write("job.toml", toml).string()});
    ASSERT_EQ(r.status.code, 0) << r.err;
    EXPECT_NE(r.out.find(verdict), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("(ZeRO-1)") != std::string::npos,
              std::string(verdict) == "ZeRO-1: on: ")
      << r.out;
  }
}

// zb-hetero's plan with every chip holding two chunks keeps what stage 1
// found: the shape in words and the search line (they were lost, and
// --compare printed an empty "plan:" for this kind alone). The Ascend 910Bs
// of cluster-1024 alone, as --compare plans them.
TEST(apps_plan_cli, zb_hetero_chunks_keep_the_search_report) {
  scratch_dir dir;
  std::ifstream in(std::string(H2_SOURCE_DIR) + "/examples/cluster-1024.toml");
  std::stringstream text;
  text << in.rdbuf();
  std::string toml = text.str();
  toml = toml.substr(0, toml.find("\n# nodes 0-31"));
  for (const auto& [from, to] :
       {std::pair{"global_batch = 2048", "global_batch = 512"},
        std::pair{"schedule = \"1f1b\"", "schedule = \"zb-hetero\""}}) {
    const auto at = toml.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    toml.replace(at, std::string(from).size(), to);
  }
  toml += "\n[[nodes]]\nrepeat = 32\nchips = [";
  for (int c = 0; c < 8; ++c)
    toml += std::string(c ? ", " : "") + "\"emulated:ascend-910b\"";
  toml += "]\n";
  auto r = run_plan(dir, {dir.write("job.toml", toml).string()});
  ASSERT_EQ(r.status.code, 0) << r.err;
  EXPECT_NE(r.out.find(" 33  0:1 "), std::string::npos)
    << "chip 0:1 in stages 1 and 33: the case of this test\n"
    << r.out;
  EXPECT_NE(r.out.find("shape: 8 replicas 8 x [ascend-910b x32], zb-hetero"),
            std::string::npos)
    << r.out;
  EXPECT_NE(r.out.find("  search: 3 layouts, "), std::string::npos) << r.out;
  // Each chunk shows what it recomputes (its chip's 1F1B stage recomputed
  // 3 blocks; this chunk holds 1).
  EXPECT_NE(r.out.find("[65, 66)    1 block "), std::string::npos) << r.out;
}

// The twin's 1F1B plan packs its chips; dealt into chunks (a deeper
// warm-up) they fit only recomputing more, which the planner adds chip by
// chip (it found no interleaved plan before).
TEST(apps_plan_cli, interleaved_chunks_recompute_what_they_need) {
  scratch_dir dir;
  const auto job = std::string(H2_SOURCE_DIR) + "/examples/twin-1024.toml";
  auto base = run_plan(dir, {job, "--schedule", "1f1b", "--json"});
  auto r = run_plan(dir, {job, "--schedule", "interleaved-1f1b", "--json"});
  ASSERT_EQ(base.status.code, 0) << base.err;
  ASSERT_EQ(r.status.code, 0) << r.err;
  const plan interleaved = plan_from_json(r.out, "stdout");
  // What the 1F1B plan dealt into as many chunks recomputes, stage by
  // stage (twin replicas are too deep for boundaries to move).
  const auto dealt =
    scheduler::deal_chunks(plan_from_json(base.out, "stdout"),
                           scheduler::chunks_per_chip(interleaved));
  ASSERT_TRUE(dealt.has_value());
  // Blocks recomputed whole, counted in steps: the attention cores half a
  // block, a whole stage one more than its blocks.
  auto steps = [](const stage_plan& s, int layers) {
    const int in = s.num_layers() - (s.first_layer == 0 ? 1 : 0) -
                   (s.end_layer == layers ? 1 : 0);
    const auto& rc = s.recompute;
    const int whole = std::min(rc.blocks, in);
    return rc.full ? 2 * in + 2 : 2 * whole + (rc.attention && whole < in);
  };
  // Dealt from this 1F1B plan, not from one of smaller micro-batches.
  ASSERT_EQ(interleaved.replicas.size(), dealt->replicas.size()) << r.out;
  ASSERT_EQ(interleaved.replicas[0].micro_batch_size,
            dealt->replicas[0].micro_batch_size)
    << r.out;
  int raised = 0;
  for (std::size_t k = 0; k < dealt->replicas.size(); ++k) {
    const auto& got = interleaved.replicas[k].stages;
    const auto& was = dealt->replicas[k].stages;
    ASSERT_EQ(got.size(), was.size());
    const int layers = was.back().end_layer;
    for (std::size_t s = 0; s < was.size(); ++s) {
      ASSERT_EQ(got[s].chip, was[s].chip);
      ASSERT_EQ(got[s].first_layer, was[s].first_layer);
      EXPECT_GE(steps(got[s], layers), steps(was[s], layers));
      raised += steps(got[s], layers) > steps(was[s], layers) ? 1 : 0;
    }
  }
  EXPECT_GT(raised, 0) << r.out;
}

struct bad_plan_case {
  std::string name;
  std::function<std::vector<std::string>(const scratch_dir&)> args;
  std::string needle;
};

class apps_plan_cli_bad_input : public ::testing::TestWithParam<bad_plan_case> {
};

TEST_P(apps_plan_cli_bad_input, exits_2_with_one_line) {
  scratch_dir dir;
  auto r = run_plan(dir, GetParam().args(dir));
  EXPECT_TRUE(r.status.exited && r.status.code == 2)
    << r.status.describe() << "\n"
    << r.err;
  expect_one_line(r.err);
  EXPECT_EQ(r.err.rfind("h2-plan: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(GetParam().needle), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

std::vector<std::string> job_with(const scratch_dir& dir,
                                  const std::string& from,
                                  const std::string& to,
                                  std::vector<std::string> extra = {}) {
  auto job = dir.write("job.toml", replaced(small_job, from, to));
  extra.insert(extra.begin(), job.string());
  return extra;
}

INSTANTIATE_TEST_SUITE_P(
  apps, apps_plan_cli_bad_input,
  ::testing::Values(
    bad_plan_case{"no_job",
                  [](const scratch_dir&) { return std::vector<std::string>{}; },
                  "job is required"},
    bad_plan_case{"missing_file",
                  [](const scratch_dir& d) {
                    return std::vector<std::string>{(d / "nope.toml").string()};
                  },
                  "nope.toml"},
    bad_plan_case{
      "bad_recompute",
      [](const scratch_dir& d) {
        return job_with(d, "lr = 1e-3", "lr = 1e-3", {"--recompute", "some"});
      },
      "--recompute: expected none, full or selective"},
    bad_plan_case{"bad_key",
                  [](const scratch_dir& d) {
                    return job_with(d, "lr = 1e-3", "lrr = 1e-3");
                  },
                  "train.lrr: unknown key"},
    bad_plan_case{"bad_topology",
                  [](const scratch_dir& d) {
                    return job_with(d, "[plan]",
                                    "[topology]\nnodes_per_host = -1\n[plan]");
                  },
                  "topology.nodes_per_host"},
    bad_plan_case{
      "bad_schedule",
      [](const scratch_dir& d) {
        return job_with(d, "[plan]", "[plan]", {"--schedule", "zb"});
      },
      "--schedule"},
    bad_plan_case{"chunks_without_interleaving",
                  [](const scratch_dir& d) {
                    return job_with(d, "[plan]", "[plan]\nchunks_per_chip = 3",
                                    {});
                  },
                  "runs one chunk per chip; several need schedule = "
                  "\"interleaved-1f1b\" or \"zb-hetero\""},
    bad_plan_case{"unknown_flag",
                  [](const scratch_dir& d) {
                    return job_with(d, "[plan]", "[plan]", {"--frobnicate"});
                  },
                  "frobnicate"},
    bad_plan_case{
      "micro_batch_divides_nothing",
      [](const scratch_dir& d) {
        return job_with(d, "[plan]", "[plan]", {"--micro-batch", "3"});
      },
      "no plan fits"},
    bad_plan_case{"does_not_fit",
                  [](const scratch_dir& d) {
                    return job_with(d, "memory_scale = 1e-3",
                                    "memory_scale = 1e-6");
                  },
                  "plan: no plan fits: "}),
  [](const auto& info) { return info.param.name; });

} // namespace
} // namespace h2::test
