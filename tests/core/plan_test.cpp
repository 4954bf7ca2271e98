#include "h2/core/plan.hpp"

#include "expect_error.hpp"

#include "test_jobs.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

namespace h2 {
namespace {

using json = nlohmann::json;
using test::expect_config_error;

/// Two replicas of different shapes (heterogeneous data parallelism).
plan sample_plan() {
  plan p;
  p.schedule = schedule_kind::gpipe;
  replica_plan a;
  a.micro_batch_size = 2;
  a.micro_batches = 3;
  a.stages = {{chip_id{0, 0}, 0, 2, {}},
              {chip_id{0, 1}, 2, 4, recompute_policy::whole()}};
  replica_plan b;
  b.micro_batch_size = 1;
  b.micro_batches = 2;
  b.stages = {{chip_id{1, 0}, 0, 1, {}},
              {chip_id{1, 1}, 1, 3, {}},
              {chip_id{1, 2}, 3, 4, recompute_policy::whole()}};
  p.replicas = {a, b};
  return p;
}

TEST(core_plan, json_round_trip_is_equal) {
  plan p = sample_plan();
  EXPECT_EQ(p.global_batch(), 2 * 3 + 1 * 2);
  for (int indent : {-1, 0, 2}) {
    plan back = plan_from_json(to_json(p, indent), "plan.json");
    EXPECT_EQ(back, p) << to_json(p, indent);
  }
  p.schedule = schedule_kind::one_f_one_b;
  EXPECT_EQ(plan_from_json(to_json(p), "plan.json"), p);
  // ZeRO-1 is written only when on, so other plans' JSON is unchanged.
  EXPECT_FALSE(json::parse(to_json(p)).contains("zero1"));
  p.zero1 = true;
  EXPECT_EQ(json::parse(to_json(p))["zero1"], true);
  EXPECT_EQ(plan_from_json(to_json(p), "plan.json"), p);
}

TEST(core_plan, json_form) {
  json j = json::parse(to_json(sample_plan()));
  EXPECT_EQ(j["format"], "h2-plan");
  EXPECT_EQ(j["version"], plan::format_version);
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["schedule"], "gpipe");
  ASSERT_EQ(j["replicas"].size(), 2u);
  EXPECT_EQ(j["replicas"][0]["micro_batch_size"], 2);
  EXPECT_EQ(j["replicas"][0]["micro_batches"], 3);
  EXPECT_EQ(j["replicas"][0]["stages"][1]["chip"], "0:1");
  EXPECT_EQ(j["replicas"][0]["stages"][1]["layers"], json::array({2, 4}));
  EXPECT_EQ(j["replicas"][0]["stages"][1]["recompute"], true);
}

TEST(core_plan, recompute_policies_have_one_text_form) {
  for (const auto& [text, policy] :
       std::vector<std::pair<std::string, recompute_policy>>{
         {"none", {}},
         {"full", recompute_policy::whole()},
         {"attention", {false, 0, true}},
         {"1 block", {false, 1, false}},
         {"3 blocks + attention", {false, 3, true}}}) {
    EXPECT_EQ(to_string(policy), text);
    EXPECT_EQ(parse_recompute(text), policy) << text;
  }
  EXPECT_EQ(parse_recompute("2blocks+attention"),
            (recompute_policy{false, 2, true}));
  for (const char* bad : {"", "yes", "-1 blocks", "2", "2 layers",
                          "attention + 2 blocks", "2 blocks + full"})
    EXPECT_FALSE(parse_recompute(bad).has_value()) << bad;
  // In a plan file: selective policies as text, none and full as booleans
  // (what version 2 files held before).
  plan p = sample_plan();
  p.replicas[0].stages[1].recompute = {false, 1, true};
  json j = json::parse(to_json(p));
  EXPECT_EQ(j["replicas"][0]["stages"][1]["recompute"], "1 block + attention");
  EXPECT_EQ(j["replicas"][0]["stages"][0]["recompute"], false);
  EXPECT_EQ(plan_from_json(j.dump(), "p"), p);
}

TEST(core_plan, recompute_is_optional) {
  json j = json::parse(to_json(sample_plan()));
  j["replicas"][0]["stages"][1].erase("recompute");
  plan p = plan_from_json(j.dump(), "p");
  EXPECT_FALSE(p.replicas[0].stages[1].recompute.any());
}

/// The sample plan's JSON, changed by `mutate`, must be rejected at `path`.
void expect_rejected(const std::function<void(json&)>& mutate,
                     const std::string& path,
                     std::initializer_list<std::string> needles) {
  json j = json::parse(to_json(sample_plan()));
  mutate(j);
  const std::string text = j.dump();
  SCOPED_TRACE(text);
  expect_config_error([&] { plan_from_json(text, "p.json"); }, path, needles);
}

TEST(core_plan, from_json_errors_name_the_json_path) {
  expect_rejected([](json& j) { j["format"] = "h2-plam"; }, "p.json.format",
                  {"\"h2-plan\""});
  expect_rejected([](json& j) { j["format"] = 1; }, "p.json.format",
                  {"\"h2-plan\""});
  expect_rejected([](json& j) { j.erase("format"); }, "p.json.format",
                  {"missing"});
  expect_rejected([](json& j) { j["version"] = 3; }, "p.json.version",
                  {"version 3 is not supported", "versions 1 to 2"});
  expect_rejected(
    [](json& j) {
      j["version"] = 1; // a chip holding two stages needs version 2
      j["replicas"][0]["stages"].push_back(
        {{"chip", "0:0"}, {"layers", {4, 5}}});
    },
    "p.json.replicas[0].stages[2].chip",
    {"chip 0:0 holds two stages", "version 1 plan"});
  expect_rejected([](json& j) { j["version"] = "1"; }, "p.json.version",
                  {"integer"});
  expect_rejected([](json& j) { j["schedule"] = "zb-v"; }, "p.json.schedule",
                  {"expected one of \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"zb-h1\""});
  expect_rejected([](json& j) { j["zero1"] = "yes"; }, "p.json.zero1",
                  {"expected true or false"});
  expect_rejected([](json& j) { j.erase("replicas"); }, "p.json.replicas",
                  {"missing required key"});
  expect_rejected([](json& j) { j["replicas"] = json::array(); },
                  "p.json.replicas", {"non-empty array"});
  expect_rejected([](json& j) { j["extra"] = 1; }, "p.json.extra",
                  {"unknown key"});
  expect_rejected([](json& j) { j["replicas"][1]["micro_batches"] = 0; },
                  "p.json.replicas[1].micro_batches", {"from 1 to"});
  // Issue 24: sizes whose product overflowed plan::global_batch ("hold 0
  // sequences per step") are refused where they are written.
  expect_rejected(
    [](json& j) { j["replicas"][0]["micro_batches"] = 1 << 30; },
    "p.json.replicas[0].micro_batches", {"from 1 to 1048576"});
  expect_rejected(
    [](json& j) {
      j["replicas"][0]["micro_batch_size"] = 1 << 20;
      j["replicas"][0]["micro_batches"] = 1 << 20;
    },
    "p.json.replicas[0].micro_batches",
    {"1099511627776 sequences", "at most 1048576"});
  expect_rejected(
    [](json& j) {
      j["replicas"][0]["micro_batch_size"] = 1 << 19;
      j["replicas"][0]["micro_batches"] = 1;
      j["replicas"][1]["micro_batch_size"] = 1 << 19;
      j["replicas"][1]["micro_batches"] = 2;
    },
    "p.json.replicas[1].micro_batches", {"summed over replicas"});
  expect_rejected([](json& j) { j["replicas"][0].erase("micro_batch_size"); },
                  "p.json.replicas[0].micro_batch_size", {"missing"});
  expect_rejected([](json& j) { j["replicas"][0]["stages"] = json::array(); },
                  "p.json.replicas[0].stages", {"non-empty array"});
  expect_rejected(
    [](json& j) { j["replicas"][0]["stages"][1]["chip"] = "0-1"; },
    "p.json.replicas[0].stages[1].chip", {"\"<node>:<index>\""});
  expect_rejected([](json& j) { j["replicas"][1]["stages"][2]["chip"] = 12; },
                  "p.json.replicas[1].stages[2].chip", {"\"<node>:<index>\""});
  expect_rejected(
    [](json& j) { j["replicas"][0]["stages"][0]["layers"] = json::array({0}); },
    "p.json.replicas[0].stages[0].layers", {"[first, end]"});
  expect_rejected(
    [](json& j) {
      j["replicas"][1]["stages"][1]["layers"] = json::array({"1", 3});
    },
    "p.json.replicas[1].stages[1].layers", {"[first, end]"});
  expect_rejected(
    [](json& j) { j["replicas"][1]["stages"][1]["layers"] = "1-3"; },
    "p.json.replicas[1].stages[1].layers", {"[first, end]"});
  expect_rejected(
    [](json& j) {
      j["replicas"][0]["stages"][0]["layers"] = {0.5, 2};
    },
    "p.json.replicas[0].stages[0].layers", {"[first, end]"});
  // Hostile numbers: out of int range must not wrap into a valid layer.
  expect_rejected(
    [](json& j) {
      j["replicas"][0]["stages"][1]["layers"] =
        json::array({2, 4294967300LL}); // 2^32 + 4 wraps to 4 as an int
    },
    "p.json.replicas[0].stages[1].layers", {"[first, end]"});
  expect_rejected(
    [](json& j) {
      j["replicas"][0]["stages"][0]["layers"] =
        json::array({-4294967296LL, 2}); // -2^32 wraps to 0
    },
    "p.json.replicas[0].stages[0].layers", {"[first, end]"});
  expect_rejected(
    [](json& j) {
      j["replicas"][0]["stages"][0]["layers"] = json::array({-1, 2});
    },
    "p.json.replicas[0].stages[0].layers", {"[first, end]"});
  expect_rejected(
    [](json& j) { j["replicas"][0]["stages"][0]["recompute"] = "yes"; },
    "p.json.replicas[0].stages[0].recompute", {"expected true, false or"});
  expect_rejected([](json& j) { j["replicas"][0]["stages"][0]["gpu"] = 0; },
                  "p.json.replicas[0].stages[0].gpu", {"unknown key"});
}

TEST(core_plan, from_json_rejects_non_json_and_non_objects) {
  expect_config_error([] { plan_from_json("{\"format\": ", "p.json"); }, "",
                      {"p.json", "invalid JSON"});
  expect_config_error([] { plan_from_json("[1, 2]", "p.json"); }, "p.json",
                      {"expected a JSON object"});
}

TEST(core_plan, a_number_too_large_for_a_double_is_invalid_json) {
  // nlohmann throws out_of_range, not parse_error, for it (found by
  // fuzz_plan_json, fuzz/corpus/plan_json/number-overflow.json).
  expect_config_error(
    [] {
      plan_from_json(R"({"format": "h2-plan", "version": 1e400})", "p.json");
    },
    "", {"p.json", "invalid JSON", "number overflow"});
}

// ---------------------------------------------------------------------------
// validate_plan against a job: two nodes, five chips, 4 layers, batch 8.

const job_config& job() {
  static const job_config j = parse_job(test::model_toml(17, 8, 16, 2, 2) + R"(
[train]
global_batch = 8
[[nodes]]
chips = ["cpu", "cpu"]
[[nodes]]
chips = ["cpu", "cpu", "cpu"]
[plan]
stages = ["0:0"]
)",
                                        "job.toml");
  return j;
}

TEST(core_plan, validate_accepts_a_matching_plan) {
  plan p = sample_plan();
  ASSERT_EQ(job().model.num_layers(), 4);
  ASSERT_EQ(p.global_batch(), job().train.global_batch);
  EXPECT_NO_THROW(validate_plan(p, job(), "plan"));
}

TEST(core_plan, validate_rejects_recomputing_more_blocks_than_held) {
  plan p = sample_plan();
  p.replicas[1].stages[1].recompute = {false, 2, false}; // [1, 3): 2 blocks
  EXPECT_NO_THROW(validate_plan(p, job(), "plan"));
  p.replicas[1].stages[2].recompute = {false, 1, false}; // [3, 4): the head
  expect_config_error([&] { validate_plan(p, job(), "plan"); },
                      "plan.replicas[1].stages[2].recompute",
                      {"recomputes 1 blocks but the stage holds 0"});
}

TEST(core_plan, validate_rejects_a_gap_in_layers) {
  plan p = sample_plan();
  p.replicas[1].stages[1].first_layer = 2; // layer 1 held by nobody
  expect_config_error([&] { validate_plan(p, job(), "plan"); },
                      "plan.replicas[1].stages[1].layers",
                      {"starting at layer 1", "got [2, 3)"});
}

TEST(core_plan, validate_rejects_an_empty_or_overlapping_stage) {
  plan p = sample_plan();
  p.replicas[0].stages[0].end_layer = 0;
  p.replicas[0].stages[1].first_layer = 0;
  expect_config_error([&] { validate_plan(p, job(), "plan"); },
                      "plan.replicas[0].stages[0].layers",
                      {"non-empty range", "got [0, 0)"});
  p = sample_plan();
  p.replicas[0].stages[1].first_layer = 1; // overlaps stage 0
  expect_config_error([&] { validate_plan(p, job(), "plan"); },
                      "plan.replicas[0].stages[1].layers",
                      {"starting at layer 2", "got [1, 4)"});
}

TEST(core_plan, validate_rejects_missing_tail_layers) {
  plan p = sample_plan();
  p.replicas[0].stages[1].end_layer = 3;
  expect_config_error([&] { validate_plan(p, job(), "plan"); },
                      "plan.replicas[0].stages",
                      {"cover layers [0, 3)", "4 layers"});
}

TEST(core_plan, validate_rejects_a_chip_used_twice) {
  plan p = sample_plan();
  p.replicas[1].stages[0].chip = chip_id{0, 1}; // also in replica 0
  expect_config_error([&] { validate_plan(p, job(), "plan"); },
                      "plan.replicas[1].stages[0].chip",
                      {"chip 0:1 serves two replicas"});
  // Two neighbouring stages on one chip are one stage.
  p = sample_plan();
  p.replicas[1].stages[1].chip = chip_id{1, 0};
  expect_config_error([&] { validate_plan(p, job(), "plan"); },
                      "plan.replicas[1].stages[1].chip",
                      {"chip 1:0 also holds the stage before"});
}

TEST(core_plan, version_1_files_are_read_and_chips_may_hold_chunks) {
  // A version 1 file (one stage per chip) reads as the same plan.
  json j = json::parse(to_json(sample_plan()));
  j["version"] = 1;
  EXPECT_EQ(plan_from_json(j.dump(), "v1.json"), sample_plan());
  // Version 2: chip 1:0 holds stages 0 and 2 of replica 1 (chunks).
  plan p = sample_plan();
  p.replicas[1].stages[2].chip = chip_id{1, 0};
  validate_plan(p, job(), "plan");
  EXPECT_EQ(plan_from_json(to_json(p), "v2.json"), p);
  EXPECT_EQ(replica_chips(p.replicas[1]),
            (std::vector<chip_id>{{1, 0}, {1, 1}}));
  EXPECT_EQ(stage_positions(p.replicas[1]), (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(plan_chips(p),
            (std::vector<chip_id>{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
}

TEST(core_plan, validate_rejects_an_unknown_chip) {
  plan p = sample_plan();
  p.replicas[1].stages[2].chip = chip_id{1, 3};
  expect_config_error([&] { validate_plan(p, job(), "plan"); },
                      "plan.replicas[1].stages[2].chip", {"no chip 1:3"});
}

TEST(core_plan, validate_rejects_a_global_batch_mismatch) {
  plan p = sample_plan();
  p.replicas[1].micro_batches = 3; // 6 + 3 = 9 sequences
  expect_config_error([&] { validate_plan(p, job(), "plan"); }, "plan.replicas",
                      {"hold 9 sequences", "train.global_batch = 8"});
}

TEST(core_plan, schedule_names) {
  EXPECT_EQ(to_string(schedule_kind::gpipe), "gpipe");
  EXPECT_EQ(to_string(schedule_kind::one_f_one_b), "1f1b");
  EXPECT_EQ(parse_schedule_kind("gpipe"), schedule_kind::gpipe);
  EXPECT_EQ(parse_schedule_kind("1f1b"), schedule_kind::one_f_one_b);
  EXPECT_FALSE(parse_schedule_kind("1F1B").has_value());
}

} // namespace
} // namespace h2
