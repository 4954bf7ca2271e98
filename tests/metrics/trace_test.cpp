#include "h2/metrics/trace.hpp"

#include "h2/core/error.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

namespace h2::metrics {
namespace {

using nlohmann::json;

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("h2_trace_" + name + "_" + std::to_string(::getpid()) + ".json");
}

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(metrics_trace_writer, writes_the_chrome_json_object_format) {
  trace_writer t;
  t.name_process(1, "node 0");
  t.name_thread(1, 2, "chip 0:1 (h100-sxm)");
  t.complete("forward mb=3", "compute", 1, 2, 1.5, 0.25,
             {{"layers", 4}, {"stage", "0"}});
  t.complete("send", "comm", 1, 3, 2.0, 0);
  t.counter("memory", 1, 2.5, {{"used_bytes", 1.5e9}});
  EXPECT_EQ(t.size(), 5u);

  auto path = temp_path("format");
  t.write(path.string());
  auto doc = read_json(path);
  std::filesystem::remove(path);
  EXPECT_EQ(doc, json::parse(t.to_string()));

  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  const auto& events = doc["traceEvents"];
  ASSERT_TRUE(events.is_array());
  ASSERT_EQ(events.size(), 5u);

  json process_name = {{"name", "process_name"},
                       {"ph", "M"},
                       {"pid", 1},
                       {"tid", 0},
                       {"args", {{"name", "node 0"}}}};
  EXPECT_EQ(events[0], process_name);
  json thread_name = {{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", 2},
                      {"args", {{"name", "chip 0:1 (h100-sxm)"}}}};
  EXPECT_EQ(events[1], thread_name);

  const auto& x = events[2];
  EXPECT_EQ(x["name"], "forward mb=3");
  EXPECT_EQ(x["cat"], "compute");
  EXPECT_EQ(x["ph"], "X");
  EXPECT_EQ(x["pid"], 1);
  EXPECT_EQ(x["tid"], 2);
  EXPECT_DOUBLE_EQ(x["ts"].get<double>(), 1.5e6); // microseconds
  EXPECT_DOUBLE_EQ(x["dur"].get<double>(), 0.25e6);
  EXPECT_EQ(x["args"], json::parse(R"({"layers":4,"stage":"0"})"));

  EXPECT_EQ(events[3]["ph"], "X");
  EXPECT_EQ(events[3]["dur"], 0);
  EXPECT_FALSE(events[3].contains("args"));

  EXPECT_EQ(events[4]["ph"], "C");
  EXPECT_DOUBLE_EQ(events[4]["ts"].get<double>(), 2.5e6);
  EXPECT_EQ(events[4]["args"]["used_bytes"], 1.5e9);
}

TEST(metrics_trace_writer, empty_trace_is_valid) {
  trace_writer t;
  auto doc = json::parse(t.to_string());
  EXPECT_EQ(doc["traceEvents"], json::array());
  EXPECT_EQ(t.size(), 0u);
}

TEST(metrics_trace_writer, awkward_strings_survive) {
  trace_writer t;
  t.complete("quote \" backslash \\ newline \n tab \t", "c\x01", 0, 0, 0, 1,
             {{"bad utf8", "\xFF"}});
  auto doc = json::parse(t.to_string());
  EXPECT_EQ(doc["traceEvents"][0]["name"],
            "quote \" backslash \\ newline \n tab \t");
  EXPECT_EQ(doc["traceEvents"][0]["cat"], "c\x01");
  EXPECT_EQ(doc["traceEvents"][0]["args"]["bad utf8"], "\xEF\xBF\xBD");
}

TEST(metrics_trace_writer, misuse_is_an_internal_error) {
  trace_writer t;
  EXPECT_THROW(t.complete("x", "c", 0, 0, 0, -1), internal_error);
  EXPECT_THROW(t.complete("x", "c", 0, 0, std::nan(""), 1), internal_error);
  EXPECT_THROW(t.complete("x", "c", 0, 0, 0, INFINITY), internal_error);
  EXPECT_THROW(t.complete("x", "c", 0, 0, 0, 1, json::array({1})),
               internal_error);
  EXPECT_THROW(t.counter("m", 0, 0, json(3)), internal_error);
  EXPECT_THROW(t.counter("m", 0, 0, {{"a", "text"}}), internal_error);
  EXPECT_EQ(t.size(), 0u);
}

TEST(metrics_trace_writer, concurrent_writers_lose_nothing) {
  trace_writer t;
  constexpr int threads = 8;
  constexpr int per_thread = 500;
  constexpr std::size_t n = per_thread;
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int tid = 0; tid < threads; ++tid)
    pool.emplace_back([&t, tid] {
      t.name_thread(0, tid, "worker " + std::to_string(tid));
      for (int i = 0; i < per_thread; ++i)
        t.complete("op", "compute", 0, tid, i * 1e-3, 1e-4, {{"i", i}});
    });
  for (auto& th : pool)
    th.join();
  EXPECT_EQ(t.size(), threads * (n + 1));
  auto events = json::parse(t.to_string())["traceEvents"];
  ASSERT_EQ(events.size(), t.size());
  std::set<std::pair<int, int>> seen;
  for (const auto& e : events)
    if (e["ph"] == "X")
      seen.emplace(e["tid"].get<int>(), e["args"]["i"].get<int>());
  EXPECT_EQ(seen.size(), threads * n);
}

TEST(metrics_trace_writer, write_failure_names_the_path) {
  trace_writer t;
  t.complete("x", "c", 0, 0, 0, 1);
  std::string path = "/nonexistent-h2-dir/sub/trace.json";
  try {
    t.write(path);
    FAIL() << "wrote to " << path;
  } catch (const h2::error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(metrics_trace_writer, write_replaces_an_existing_file) {
  auto path = temp_path("replace");
  {
    std::ofstream out(path);
    out << std::string(10000, 'z');
  }
  trace_writer t;
  t.name_process(0, "p");
  t.write(path.string());
  auto doc = read_json(path);
  std::filesystem::remove(path);
  EXPECT_EQ(doc["traceEvents"].size(), 1u);
}

} // namespace
} // namespace h2::metrics
