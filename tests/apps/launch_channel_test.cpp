// What h2-launch --nodes hands its h2-node processes and hears back from
// them (docs/cli.md, "Several processes"): the run flags go through one
// table (run_flags.hpp), so that every flag a launch takes reaches its
// nodes as given; a node's events come as JSON lines (node_report.hpp),
// and anything else on that channel is ignored.
#include "h2/apps/node_report.hpp"
#include "h2/apps/run_flags.hpp"

#include <gtest/gtest.h>

#include <set>

#include <fcntl.h>
#include <unistd.h>

namespace h2::apps {
namespace {

/// Every run flag set to something other than its default.
run_flags every_flag_set() {
  run_flags f;
  f.steps = 7;
  f.json_log = "log.jsonl";
  f.trace = "trace.json";
  f.plan_path = "plan.json";
  f.export_path = "model.safetensors";
  f.metrics_port = 9400;
  f.admin_port = 0;
  f.no_metrics = true;
  f.quiet = true;
  f.stop_after = 3;
  f.resume = "latest";
  f.init_from = "hf-model";
  f.replans = {"2:a.json", "4:b.json"};
  f.join_timeout_seconds = 0.1 + 0.2; // every bit must survive
  return f;
}

/// `argv` parsed by a command line that has the run flags.
run_flags parsed(const std::vector<std::string>& argv) {
  CLI::App cli;
  run_flags f;
  add_run_flags(cli, f);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());
  cli.parse(reversed);
  return f;
}

TEST(apps_launch_channel, the_coordinators_node_gets_every_run_flag_as_given) {
  const auto f = every_flag_set();
  auto argv = run_flags_argv(f, true);
  // The launcher sets each node's metrics port itself (per_node).
  argv.insert(argv.end(), {"--metrics-port", "9400", "--no-metrics"});
  const auto back = parsed(argv);
  EXPECT_EQ(back.steps, f.steps);
  EXPECT_EQ(back.json_log, f.json_log);
  EXPECT_EQ(back.trace, f.trace);
  EXPECT_EQ(back.plan_path, f.plan_path);
  EXPECT_EQ(back.export_path, f.export_path);
  EXPECT_EQ(back.admin_port, f.admin_port);
  EXPECT_EQ(back.quiet, f.quiet);
  EXPECT_EQ(back.stop_after, f.stop_after);
  EXPECT_EQ(back.resume, f.resume);
  EXPECT_EQ(back.init_from, f.init_from);
  EXPECT_EQ(back.replans, f.replans);
  EXPECT_EQ(back.join_timeout_seconds, f.join_timeout_seconds);
  // The table names every flag the command line has, once.
  CLI::App cli;
  cli.set_help_flag(); // none: only the run flags
  run_flags unused;
  add_run_flags(cli, unused);
  std::set<std::string> names;
  for (const auto& flag : run_flag_table())
    EXPECT_TRUE(names.insert(flag.name).second) << flag.name;
  EXPECT_EQ(names.size(), cli.get_options().size());
  for (const auto* option : cli.get_options())
    EXPECT_EQ(names.count("--" + option->get_lnames().front()), 1u)
      << option->get_name();
}

TEST(apps_launch_channel, other_nodes_get_only_what_every_node_needs) {
  const auto back = parsed(run_flags_argv(every_flag_set(), false));
  EXPECT_EQ(back.steps, 7);
  EXPECT_TRUE(back.quiet);
  EXPECT_EQ(back.join_timeout_seconds, 0.1 + 0.2);
  EXPECT_TRUE(back.json_log.empty());
  EXPECT_TRUE(back.resume.empty());
  EXPECT_TRUE(back.replans.empty());
  EXPECT_EQ(back.admin_port, -1);
  EXPECT_EQ(back.stop_after, 0);
  EXPECT_TRUE(run_flags_argv(run_flags{}, true).empty()) << "defaults: none";
}

TEST(apps_launch_channel, a_nodes_events_arrive_as_sent_and_nothing_else) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  {
    node_report report(p[1]); // closes it
    report.state("starting");
    report.listening("coordinator", "127.0.0.1", 4242);
    report.listening("metrics", "::1", 9401);
  }
  std::string text;
  char buf[256];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof(buf))) > 0;)
    text.append(buf, static_cast<std::size_t>(n));
  ::close(p[0]);
  std::vector<node_event> events;
  for (std::size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos;
       at = nl + 1)
    if (auto e = parse_node_event(text.substr(at, nl - at)))
      events.push_back(*e);
  ASSERT_EQ(events.size(), 3u) << text;
  EXPECT_EQ(events[0].event, "state");
  EXPECT_EQ(events[0].state, "starting");
  EXPECT_EQ(events[1].service, "coordinator");
  EXPECT_EQ(events[1].address, "127.0.0.1:4242");
  EXPECT_EQ(events[2].address, "::1:9401");
  for (const char* garbage :
       {"", "coordinator at 127.0.0.1:1", "[]", R"({"event":"listening"})",
        R"({"event":"listening","service":"metrics","address":"nowhere"})",
        R"({"event":"state","state":5})", R"({"event":"reboot"})"})
    EXPECT_FALSE(parse_node_event(garbage)) << garbage;
  EXPECT_FALSE(parse_node_event(std::string(5000, ' ')));
  node_report nowhere; // -1: a node started by hand writes nothing
  nowhere.state("running");
}

} // namespace
} // namespace h2::apps
