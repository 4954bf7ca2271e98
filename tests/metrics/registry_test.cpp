#include "h2/metrics/registry.hpp"

#include "h2/core/error.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace h2::metrics {
namespace {

TEST(metrics_registry, get_or_create_returns_the_same_object) {
  registry r;
  auto& a = r.get_counter("h2_steps_total", "Steps.", {{"chip", "0:0"}});
  auto& b = r.get_counter("h2_steps_total", "Steps.", {{"chip", "0:0"}});
  auto& c = r.get_counter("h2_steps_total", "Steps.", {{"chip", "0:1"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  auto& g1 = r.get_gauge("h2_memory_used_bytes", "Memory.");
  auto& g2 = r.get_gauge("h2_memory_used_bytes", "Memory.");
  EXPECT_EQ(&g1, &g2);
  auto& h1 = r.get_histogram("h2_step_seconds", "Step.", {0.1, 1});
  auto& h2 = r.get_histogram("h2_step_seconds", "Step.", {0.1, 1});
  EXPECT_EQ(&h1, &h2);
}

TEST(metrics_registry, label_order_does_not_make_another_series) {
  registry r;
  auto& a = r.get_gauge("h2_g", "G.", {{"chip", "0:0"}, {"stage", "1"}});
  auto& b = r.get_gauge("h2_g", "G.", {{"stage", "1"}, {"chip", "0:0"}});
  EXPECT_EQ(&a, &b);
  a.set(2);
  // Exposed in the order first given.
  EXPECT_NE(r.expose().find("h2_g{chip=\"0:0\",stage=\"1\"} 2\n"),
            std::string::npos)
    << r.expose();
}

TEST(metrics_registry, references_survive_many_registrations) {
  registry r;
  auto& first = r.get_counter("h2_x_total", "X.", {{"i", "0"}});
  first.inc(7);
  for (int i = 1; i < 1000; ++i)
    r.get_counter("h2_x_total", "X.", {{"i", std::to_string(i)}}).inc();
  EXPECT_EQ(&first, &r.get_counter("h2_x_total", "X.", {{"i", "0"}}));
  EXPECT_EQ(first.value(), 7);
}

TEST(metrics_registry, counter_and_gauge_values) {
  registry r;
  auto& c = r.get_counter("h2_bytes_total", "Bytes.");
  EXPECT_EQ(c.value(), 0);
  c.inc();
  c.inc(2.5);
  c.inc(0);
  EXPECT_EQ(c.value(), 3.5);
  EXPECT_THROW(c.inc(-1), internal_error);
  EXPECT_THROW(c.inc(std::nan("")), internal_error);
  EXPECT_EQ(c.value(), 3.5);

  auto& g = r.get_gauge("h2_queue_depth", "Depth.");
  g.set(10);
  g.inc();
  g.dec(4);
  g.inc(-0.5);
  EXPECT_EQ(g.value(), 6.5);
}

TEST(metrics_registry, misuse_is_an_internal_error) {
  registry r;
  r.get_counter("h2_a_total", "A.");
  // Another type, another help.
  EXPECT_THROW(r.get_gauge("h2_a_total", "A."), internal_error);
  EXPECT_THROW(r.get_counter("h2_a_total", "Other."), internal_error);
  // Counters end in _total.
  EXPECT_THROW(r.get_counter("h2_a", "A."), internal_error);
  // Metric names.
  EXPECT_THROW(r.get_gauge("", "G."), internal_error);
  EXPECT_THROW(r.get_gauge("1abc", "G."), internal_error);
  EXPECT_THROW(r.get_gauge("h2-g", "G."), internal_error);
  EXPECT_THROW(r.get_gauge("h2 g", "G."), internal_error);
  EXPECT_NO_THROW(r.get_gauge("h2:ok_g", "G."));
  EXPECT_NO_THROW(r.get_gauge("_h2_G9", "G."));
  // Label names.
  EXPECT_THROW(r.get_gauge("h2_g", "G.", {{"__x", "v"}}), internal_error);
  EXPECT_THROW(r.get_gauge("h2_g", "G.", {{"a:b", "v"}}), internal_error);
  EXPECT_THROW(r.get_gauge("h2_g", "G.", {{"9a", "v"}}), internal_error);
  EXPECT_THROW(r.get_gauge("h2_g", "G.", {{"", "v"}}), internal_error);
  EXPECT_THROW(r.get_gauge("h2_g", "G.", {{"a", "1"}, {"a", "2"}}),
               internal_error);
  EXPECT_NO_THROW(r.get_gauge("h2_g", "G.", {{"_a", "v"}}));
  // Histograms: bounds sorted and finite, the same for every series, no
  // `le` label.
  EXPECT_THROW(r.get_histogram("h2_h", "H.", {1, 0.5}), internal_error);
  EXPECT_THROW(r.get_histogram("h2_h", "H.", {1, 1}), internal_error);
  EXPECT_THROW(r.get_histogram("h2_h", "H.", {std::nan(""), 1}),
               internal_error);
  EXPECT_THROW(r.get_histogram("h2_h", "H.", {1}, {{"le", "1"}}),
               internal_error);
  r.get_histogram("h2_h", "H.", {1, 2});
  EXPECT_THROW(r.get_histogram("h2_h", "H.", {1, 3}, {{"a", "b"}}),
               internal_error);
  // A trailing +Inf is the implicit bucket, so these bounds are the same.
  EXPECT_NO_THROW(r.get_histogram(
    "h2_h", "H.", {1, 2, std::numeric_limits<double>::infinity()}));
  // Sample names of different families must not clash.
  EXPECT_THROW(r.get_gauge("h2_h_count", "G."), internal_error);
  r.get_gauge("h2_k_sum", "G.");
  EXPECT_THROW(r.get_histogram("h2_k", "H.", {1}), internal_error);
}

TEST(metrics_registry, concurrent_updates_add_up_exactly) {
  registry r;
  constexpr int threads = 8;
  constexpr int per_thread = 20000;
  constexpr std::uint64_t n = per_thread;
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&r, t] {
      // Every thread looks the metrics up itself, racing registration too.
      auto& c = r.get_counter("h2_ops_total", "Ops.", {{"kind", "x"}});
      auto& g = r.get_gauge("h2_level", "Level.");
      auto& h = r.get_histogram("h2_op_seconds", "Op.", {0.5, 1.5});
      for (int i = 0; i < per_thread; ++i) {
        c.inc();
        g.inc(2);
        g.dec();
        h.observe(t % 3);
      }
    });
  for (auto& t : pool)
    t.join();
  EXPECT_EQ(r.get_counter("h2_ops_total", "Ops.", {{"kind", "x"}}).value(),
            threads * per_thread);
  EXPECT_EQ(r.get_gauge("h2_level", "Level.").value(), threads * per_thread);
  auto s = r.get_histogram("h2_op_seconds", "Op.", {0.5, 1.5}).snapshot();
  EXPECT_EQ(s.count, threads * n);
  // Threads 0, 3, 6 observe 0; 1, 4, 7 observe 1; 2, 5 observe 2.
  EXPECT_EQ(s.cumulative_counts,
            (std::vector<std::uint64_t>{3 * n, 6 * n, 8 * n}));
  EXPECT_EQ(s.sum, (3 * 1 + 2 * 2) * per_thread);
}

TEST(metrics_registry, expose_sorts_families_and_writes_help_and_type) {
  registry r;
  r.get_gauge("h2_b", "B gauge.").set(1);
  r.get_counter("h2_a_total", "A counter.").inc(3);
  r.get_gauge("h2_c", "C gauge.", {{"x", "2"}}).set(-2);
  r.get_gauge("h2_c", "C gauge.", {{"x", "1"}}).set(0.25);
  EXPECT_EQ(r.expose(), "# HELP h2_a_total A counter.\n"
                        "# TYPE h2_a_total counter\n"
                        "h2_a_total 3\n"
                        "# HELP h2_b B gauge.\n"
                        "# TYPE h2_b gauge\n"
                        "h2_b 1\n"
                        "# HELP h2_c C gauge.\n"
                        "# TYPE h2_c gauge\n"
                        "h2_c{x=\"1\"} 0.25\n"
                        "h2_c{x=\"2\"} -2\n");
}

TEST(metrics_registry, expose_escapes_help_and_label_values) {
  registry r;
  r.get_gauge("h2_g", "Line one\nback\\slash \"quoted\"",
              {{"path", "C:\\dir\\"}, {"q", "say \"hi\""}, {"nl", "a\nb"}})
    .set(1);
  EXPECT_EQ(r.expose(),
            "# HELP h2_g Line one\\nback\\\\slash \"quoted\"\n"
            "# TYPE h2_g gauge\n"
            "h2_g{path=\"C:\\\\dir\\\\\",q=\"say \\\"hi\\\"\",nl=\"a\\nb\"} "
            "1\n");
}

TEST(metrics_registry, expose_replaces_invalid_utf8) {
  registry r;
  r.get_gauge("h2_g", "G.", {{"a", "ok \xC3\xA9 bad \xFF end \xE2\x82"}})
    .set(1);
  EXPECT_NE(r.expose().find("a=\"ok \xC3\xA9 bad \xEF\xBF\xBD end "
                            "\xEF\xBF\xBD\xEF\xBF\xBD\"}"),
            std::string::npos)
    << r.expose();
}

TEST(metrics_registry, histogram_buckets_are_cumulative) {
  registry r;
  auto& h = r.get_histogram("h2_step_seconds", "Step time.",
                            {0.005, 0.1, 1, 2.5}, {{"chip", "0:0"}});
  for (double v : {0.001, 0.005, 0.05, 0.1, 0.5, 3.0, 100.0})
    h.observe(v);
  EXPECT_EQ(r.expose(),
            "# HELP h2_step_seconds Step time.\n"
            "# TYPE h2_step_seconds histogram\n"
            "h2_step_seconds_bucket{chip=\"0:0\",le=\"0.005\"} 2\n"
            "h2_step_seconds_bucket{chip=\"0:0\",le=\"0.1\"} 4\n"
            "h2_step_seconds_bucket{chip=\"0:0\",le=\"1\"} 5\n"
            "h2_step_seconds_bucket{chip=\"0:0\",le=\"2.5\"} 5\n"
            "h2_step_seconds_bucket{chip=\"0:0\",le=\"+Inf\"} 7\n"
            "h2_step_seconds_sum{chip=\"0:0\"} " +
              format_value(0.001 + 0.005 + 0.05 + 0.1 + 0.5 + 3.0 + 100.0) +
              "\n"
              "h2_step_seconds_count{chip=\"0:0\"} 7\n");
}

TEST(metrics_registry, histogram_edge_cases) {
  histogram none(std::vector<double>{});
  none.observe(5);
  auto s = none.snapshot();
  EXPECT_EQ(s.cumulative_counts, std::vector<std::uint64_t>{1});
  EXPECT_EQ(s.count, 1u);
  EXPECT_EQ(s.sum, 5);

  histogram h({1, 2});
  h.observe(std::nan(""));
  h.observe(-std::numeric_limits<double>::infinity());
  s = h.snapshot();
  EXPECT_EQ(s.cumulative_counts, (std::vector<std::uint64_t>{1, 1, 2}));
  EXPECT_TRUE(std::isnan(s.sum));

  registry r;
  r.get_histogram("h2_empty_seconds", "E.", {1});
  EXPECT_NE(r.expose().find("h2_empty_seconds_bucket{le=\"+Inf\"} 0\n"
                            "h2_empty_seconds_sum 0\n"
                            "h2_empty_seconds_count 0\n"),
            std::string::npos);
}

TEST(metrics_registry, format_value_round_trips) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(-0.0), "0");
  EXPECT_EQ(format_value(42), "42");
  EXPECT_EQ(format_value(-7), "-7");
  EXPECT_EQ(format_value(1e6), "1000000");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(2.5e-7), "2.5e-07");
  EXPECT_EQ(format_value(1e20), "1e+20");
  EXPECT_EQ(format_value(std::nan("")), "NaN");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  for (double v :
       {0.1 + 0.2, 1.0 / 3, 123456.789, 9.007199254740993e15,
        std::numeric_limits<double>::min(), std::numeric_limits<double>::max()})
    EXPECT_EQ(std::stod(format_value(v)), v) << format_value(v);
}

} // namespace
} // namespace h2::metrics
