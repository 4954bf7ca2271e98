// Bad input to h2-launch (job file, plan file, command line): exit code 2,
// one line on stderr naming what is wrong, nothing started.
#include "launch.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

namespace h2::test {
namespace {

/// A plan for small_job in the JSON form of core/plan.hpp, whose one stage
/// list is `stages` (a JSON array text).
std::string plan_json(const std::string& stages, int micro_batch_size = 2,
                      int micro_batches = 4) {
  return R"({"format": "h2-plan", "version": 1, "schedule": "1f1b",
  "replicas": [{"micro_batch_size": )" +
         std::to_string(micro_batch_size) + R"(, "micro_batches": )" +
         std::to_string(micro_batches) + R"(, "stages": )" + stages + "}]}\n";
}

const std::string good_stages =
  R"([{"chip": "0:0", "layers": [0, 3]}, {"chip": "1:0", "layers": [3, 6]}])";

/// One bad invocation: the arguments (after writing what it needs into the
/// scratch directory) and what stderr must contain.
struct bad_run {
  std::vector<std::string> args;
  std::vector<std::string> needles;
};

struct bad_input_case {
  std::string name;
  std::function<bad_run(const scratch_dir&)> make;
};

/// A case whose job file is small_job with `from` replaced by `to`.
bad_input_case bad_job(std::string name, std::string from, std::string to,
                       std::vector<std::string> needles) {
  return {std::move(name), [=](const scratch_dir& dir) {
            auto job = dir.write("job.toml", replaced(small_job, from, to));
            return bad_run{{job.string()}, needles};
          }};
}

/// A case running small_job with --plan set to a file holding `plan`.
bad_input_case bad_plan(std::string name, std::string plan,
                        std::vector<std::string> needles) {
  return {std::move(name), [=](const scratch_dir& dir) {
            auto job = dir.write("job.toml", small_job);
            auto p = dir.write("plan.json", plan);
            return bad_run{{job.string(), "--plan", p.string()}, needles};
          }};
}

/// A case running small_job with extra command-line arguments.
bad_input_case bad_flags(std::string name, std::vector<std::string> flags,
                         std::vector<std::string> needles) {
  return {std::move(name), [=](const scratch_dir& dir) {
            auto job = dir.write("job.toml", small_job);
            bad_run r{{job.string()}, needles};
            r.args.insert(r.args.end(), flags.begin(), flags.end());
            return r;
          }};
}

const std::string model_table = R"([model]
vocab_size = 17
seq_len = 16
d_model = 32
n_head = 2
n_layer = 4
)";

std::vector<bad_input_case> cases() {
  return {
    bad_job("missing_model_table", model_table, "", {"model", "[model]"}),
    bad_job("missing_key", "d_model = 32\n", "", {"model.d_model", "missing"}),
    bad_job("wrong_type", "seq_len = 16", "seq_len = \"16\"",
            {"model.seq_len", "integer"}),
    bad_job("wrong_enum_value", "clock = \"virtual\"", "clock = \"sundial\"",
            {"emulation.clock", "sundial"}),
    bad_job("unknown_profile", "emulated:mi250x", "emulated:mi999",
            {"nodes[0].chips[1]", "mi999"}),
    bad_job("layers_do_not_sum_to_the_model", "layers = [2, 3, 1]",
            "layers = [2, 2, 1]", {"plan.layers", "6"}),
    bad_job("micro_batch_does_not_divide_global_batch", "micro_batch = 2",
            "micro_batch = 3", {"train.micro_batch", "global_batch"}),
    bad_job("unknown_key", "lr = 1e-3\n", "lr = 1e-3\nlearning_rate = 2\n",
            {"train.learning_rate", "unknown key"}),
    bad_job("join_timeout_not_positive", "layers = [2, 3, 1]\n",
            "layers = [2, 3, 1]\n\n[cluster]\njoin_timeout_seconds = -1\n",
            {"cluster.join_timeout_seconds", "got -1"}),
    {"broken_toml",
     [](const scratch_dir& dir) {
       std::string text = replaced(small_job, "[train]\n", "[train\n");
       // Line (1-based) of the broken header.
       auto at = text.find("[train\n");
       int line =
         1 + static_cast<int>(std::count(
               text.begin(), text.begin() + static_cast<long>(at), '\n'));
       auto job = dir.write("job.toml", text);
       return bad_run{
         {job.string()},
         {"job.toml:" + std::to_string(line) + ":", "invalid TOML"}};
     }},
    {"job_file_does_not_exist",
     [](const scratch_dir& dir) {
       auto job = dir / "no-such-job.toml";
       return bad_run{{job.string()}, {"no-such-job.toml"}};
     }},
    bad_plan("plan_is_not_json", "{\"format\": \"h2-plan\", \"version\": 1,",
             {"plan.json", "invalid JSON"}),
    bad_plan("plan_misses_a_key",
             R"({"format": "h2-plan", "version": 1, "schedule": "1f1b"})",
             {"plan.json.replicas", "missing"}),
    bad_plan("plan_layers_do_not_cover_the_model",
             plan_json(R"([{"chip": "0:0", "layers": [0, 3]},
                           {"chip": "1:0", "layers": [3, 5]}])"),
             {"plan.json.replicas[0].stages", "6 layers"}),
    bad_plan("plan_names_a_chip_not_in_the_job",
             plan_json(R"([{"chip": "0:0", "layers": [0, 3]},
                           {"chip": "3:0", "layers": [3, 6]}])"),
             {"plan.json.replicas[0].stages[1].chip", "3:0"}),
    bad_plan("plan_batch_differs_from_the_job", plan_json(good_stages, 2, 3),
             {"plan.json.replicas", "train.global_batch"}),
    bad_plan("plan_gives_a_1f1b_chip_two_chunks",
             R"({"format": "h2-plan", "version": 2, "schedule": "1f1b",
  "replicas": [{"micro_batch_size": 2, "micro_batches": 4, "stages": [
    {"chip": "0:0", "layers": [0, 2]}, {"chip": "1:0", "layers": [2, 4]},
    {"chip": "0:0", "layers": [4, 6]}]}]})",
             {"plan.json.replicas[0].stages",
              "1f1b runs one chunk per chip; use interleaved-1f1b or "
              "zb-hetero"}),
    bad_plan("plan_interleaves_unevenly",
             R"({"format": "h2-plan", "version": 2,
  "schedule": "interleaved-1f1b",
  "replicas": [{"micro_batch_size": 2, "micro_batches": 4, "stages": [
    {"chip": "0:0", "layers": [0, 2]}, {"chip": "1:0", "layers": [2, 4]},
    {"chip": "0:0", "layers": [4, 6]}]}]})",
             {"plan.json.replicas[0].stages",
              "interleaved-1f1b needs every chip to hold the same number"}),
    {"plan_file_does_not_exist",
     [](const scratch_dir& dir) {
       auto job = dir.write("job.toml", small_job);
       return bad_run{{job.string(), "--plan", (dir / "no-plan.json").string()},
                      {"no-plan.json"}};
     }},
    bad_flags("unknown_flag", {"--bogus"}, {"--bogus"}),
    bad_flags("steps_not_a_number", {"--steps", "many"}, {"--steps"}),
    bad_flags("steps_zero", {"--steps", "0"}, {"--steps"}),
    bad_flags("metrics_port_out_of_range", {"--metrics-port", "70000"},
              {"--metrics-port"}),
    bad_flags("join_timeout_zero", {"--join-timeout", "0"},
              {"--join-timeout", "got 0"}),
    bad_flags("join_timeout_not_a_number", {"--join-timeout", "soon"},
              {"--join-timeout"}),
    bad_flags("replan_without_a_step", {"--replan", "plan.json"},
              {"--replan", "STEP:PLAN.json"}),
    {"admin_certificate_that_does_not_load",
     [](const scratch_dir& dir) {
       auto token = dir.write("admin.token", "0123456789abcdef-x\n");
       std::filesystem::permissions(token,
                                    std::filesystem::perms::owner_read |
                                      std::filesystem::perms::owner_write);
       auto job = dir.write("job.toml",
                            small_job + "\n[admin]\nport = 0\ntoken_file = \"" +
                              token.string() + "\"\ncertificate = \"" +
                              (dir / "no.pem").string() + "\"\nkey = \"" +
                              (dir / "no.key").string() + "\"\n");
       return bad_run{{job.string(), "--admin-port", "0"},
                      {"admin.certificate", "no.pem"}};
     }},
    {"page_token_without_an_admin_endpoint",
     [](const scratch_dir& dir) {
       auto job =
         dir.write("job.toml", small_job + "\n[admin]\ntoken_file = \"t\"\n"
                                           "page = \"token\"\n");
       return bad_run{{job.string()}, {"admin.page", "admin.port"}};
     }},
    {"replan_onto_other_chips",
     [](const scratch_dir& dir) {
       // The job runs on 0:0, 0:1, 1:0; the re-plan on 0:0 and 1:0.
       auto job = dir.write("job.toml", small_job);
       auto p = dir.write("other.json", plan_json(good_stages));
       return bad_run{{job.string(), "--replan", "2:" + p.string()},
                      {"the re-plan before step 2", "keeps the chips"}};
     }},
  };
}

/// Names the case in test listings (instead of its bytes).
void PrintTo(const bad_input_case& c, std::ostream* os) {
  *os << c.name;
}

class apps_bad_input : public ::testing::TestWithParam<bad_input_case> {};

TEST_P(apps_bad_input, exits_2_with_one_line_naming_the_key) {
  scratch_dir dir;
  bad_run run = GetParam().make(dir);
  auto r = run_to_end(launch_binary, run.args, dir, run_timeout);
  ASSERT_FALSE(r.status.timed_out) << "h2-launch hung; stdout:\n" << r.out;
  EXPECT_TRUE(r.status.exited && r.status.code == 2)
    << "expected exit code 2, got " << r.status.describe() << "\nstderr:\n"
    << r.err;
  expect_one_line(r.err);
  EXPECT_EQ(r.err.rfind("h2-launch: error: ", 0), 0u)
    << "stderr should start with 'h2-launch: error: ': " << r.err;
  for (const auto& needle : run.needles)
    EXPECT_NE(r.err.find(needle), std::string::npos)
      << "stderr should name '" << needle << "': " << r.err;
  // Nothing started: no setup report, no step.
  EXPECT_TRUE(step_lines(r.out).empty()) << "stdout:\n" << r.out;
  EXPECT_EQ(r.out.find("h2: job"), std::string::npos) << "stdout:\n" << r.out;
}

INSTANTIATE_TEST_SUITE_P(
  jobs_plans_and_flags, apps_bad_input, ::testing::ValuesIn(cases()),
  [](const ::testing::TestParamInfo<bad_input_case>& info) {
    return info.param.name;
  });

} // namespace
} // namespace h2::test
