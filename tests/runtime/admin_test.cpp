// The admin protocol without sockets or actors (docs/admin.md): requests
// round-trip, malformed ones are refused with a reason, a request sealed
// under another token or replayed fails the check, every command's
// arguments are checked, the token file must be private and long enough,
// and the inbox hands commands to the scheduler and answers back.
#include "h2/core/files.hpp"
#include "h2/runtime/admin.hpp"
#include "h2/runtime/rebalancing.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

namespace h2::runtime {
namespace {

const transport::job_secret token("a-long-enough-admin-token");
const std::string session = make_admin_session();

TEST(runtime_admin, a_sealed_request_round_trips_and_verifies_once) {
  const auto r =
    seal_admin_request(token, 42, session, "throttle", {"0:1", "2"});
  const auto back = decode_admin_request(encode_admin_request(r));
  EXPECT_EQ(back.command, "throttle");
  EXPECT_EQ(back.args, (std::vector<std::string>{"0:1", "2"}));
  EXPECT_EQ(back.seal.seq, 42u);
  transport::control_verifier verifier(
    std::make_shared<const transport::job_secret>(token));
  auto check = [&](const admin_request& x) {
    return verifier.accept(admin_seal_type(x.command), x.seal,
                           admin_payload(session, x.args));
  };
  EXPECT_TRUE(check(back));
  EXPECT_FALSE(check(back)) << "a replay";
  auto older = seal_admin_request(token, 41, session, "status", {});
  EXPECT_FALSE(check(older)) << "a sequence number below one accepted";
  auto wrong = seal_admin_request(transport::job_secret("another-token-16b"),
                                  43, session, "status", {});
  EXPECT_FALSE(check(wrong)) << "another token";
  auto tampered =
    seal_admin_request(token, 44, session, "throttle", {"0:1", "2"});
  tampered.args[1] = "200";
  EXPECT_FALSE(check(tampered)) << "arguments changed after sealing";
  auto renamed = seal_admin_request(token, 45, session, "pause", {});
  renamed.command = "stop";
  EXPECT_FALSE(check(renamed)) << "command changed after sealing";
  EXPECT_TRUE(check(seal_admin_request(token, 46, session, "status", {})));
  // Sealed for another run's session: the MAC covers the session.
  auto other_run =
    seal_admin_request(token, 47, make_admin_session(), "status", {});
  other_run.session = session;
  EXPECT_FALSE(check(other_run)) << "sealed for another session";
  EXPECT_EQ(back.session, session);
  EXPECT_TRUE(is_admin_session(session));
  EXPECT_NE(make_admin_session(), session);
  EXPECT_FALSE(is_admin_session("0123"));
  EXPECT_TRUE(decode_admin_request(admin_session_query).asks_session());
  EXPECT_FALSE(back.asks_session());
}

TEST(runtime_admin, malformed_requests_are_refused_with_a_reason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
    {"", "not a JSON object"},
    {"stop", "not a JSON object"},
    {"[1, 2]", "not a JSON object"},
    {R"({"command": "stop", "args": [], "mac": "00"})", "no \"seq\""},
    {R"({"seq": 1, "command": "stop", "args": [], "mac": "00"})",
     "no \"session\""},
    {R"({"command": "session", "mac": "00"})", "no \"seq\""},
    {R"({"seq": 1, "session": "", "command": "stop", "args": [], "mac": ""})",
     "empty \"mac\""},
    {R"({"seq": -1, "session": "", "command": "stop", "args": [], "mac": "00"})",
     "\"seq\""},
    {R"({"seq": 1, "session": "", "command": 5, "args": [], "mac": "00"})",
     "strings"},
    {R"({"seq": 1, "session": "", "command": "stop", "args": "x", "mac": "00"})",
     "not an array"},
    {R"({"seq": 1, "session": "", "command": "stop", "args": [1], "mac": "00"})",
     "not a string"},
    {R"({"seq": 1, "session": "", "command": "stop", "args": [], "mac": "00", "x": 1})",
     "unknown fields"},
    {std::string(max_admin_request_bytes + 1, ' '), "longer than"},
  };
  for (const auto& [line, reason] : cases) {
    try {
      decode_admin_request(line);
      ADD_FAILURE() << "accepted: " << line.substr(0, 80);
    } catch (const admin_error& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos)
        << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("malformed request", 0), 0u);
    }
  }
}

TEST(runtime_admin, commands_and_their_arguments_are_checked) {
  EXPECT_EQ(parse_admin_command("status", {}).verb, admin_verb::status);
  EXPECT_EQ(parse_admin_command("stop", {}).verb, admin_verb::stop);
  EXPECT_TRUE(parse_admin_command("rebalance", {"--auto"}).best);
  const auto plan = parse_admin_command("rebalance", {"--plan", "{}"});
  EXPECT_FALSE(plan.best);
  EXPECT_EQ(plan.plan_json, "{}");
  EXPECT_FALSE(plan.restart);
  EXPECT_TRUE(
    parse_admin_command("rebalance", {"--plan", "{}", "--restart"}).restart);
  EXPECT_EQ(parse_admin_command("policy", {"auto"}).mode,
            rebalance_mode::automatic);
  const auto t = parse_admin_command("throttle", {"1:0", "2.5"});
  EXPECT_EQ(t.chip, (chip_id{1, 0}));
  EXPECT_EQ(t.factor, 2.5);

  const std::vector<
    std::tuple<std::string, std::vector<std::string>, std::string>>
    bad = {
      {"frob", {}, "unknown command \"frob\""},
      {"status", {"x"}, "expected no arguments"},
      {"policy", {}, "auto or off"},
      {"policy", {"on"}, "\"on\""},
      {"throttle", {"0:1"}, "CHIP FACTOR"},
      {"throttle", {"zero", "2"}, "chip id"},
      {"throttle", {"0:1", "0"}, "(0, 1000]"},
      {"throttle", {"0:1", "-2"}, "(0, 1000]"},
      {"throttle", {"0:1", "1e9"}, "(0, 1000]"},
      {"throttle", {"0:1", "nan"}, "(0, 1000]"},
      {"throttle", {"0:1", "2x"}, "(0, 1000]"},
      {"rebalance", {}, "--auto or --plan"},
      {"rebalance", {"--plan"}, "--auto or --plan"},
      {"rebalance", {"--plan", "{}", "--now"}, "--auto or --plan"},
    };
  for (const auto& [command, args, reason] : bad) {
    try {
      parse_admin_command(command, args);
      ADD_FAILURE() << "accepted: " << command;
    } catch (const admin_error& e) {
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos)
        << command << ": " << e.what();
    }
  }
}

TEST(runtime_admin, the_token_file_must_be_private_and_long_enough) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("h2-admin-token-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text,
                   mode_t mode) {
    const auto path = (dir / name).string();
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  };
  auto key_and_message = [](const std::string& path) {
    try {
      load_admin_token(path);
    } catch (const config_error& e) {
      return e.key_path() + ": " + e.what();
    }
    return std::string("accepted");
  };
  const auto good = write("good", "0123456789abcdef\n", 0600);
  EXPECT_NE(load_admin_token(good), nullptr);
  EXPECT_NE(key_and_message(write("shared", "0123456789abcdef", 0640))
              .find("readable by group or others"),
            std::string::npos);
  EXPECT_NE(
    key_and_message(write("short", "0123456789\n", 0600)).find("at least 16"),
    std::string::npos);
  const auto missing = key_and_message((dir / "none").string());
  EXPECT_EQ(missing.rfind("admin.token_file: ", 0), 0u) << missing;
  h2::remove_tree(dir);
}

TEST(runtime_admin, the_inbox_answers_only_while_a_run_is_open) {
  admin_inbox inbox;
  auto closed = inbox.ask(parse_admin_command("status", {}));
  EXPECT_FALSE(closed.ok);
  EXPECT_NE(closed.body.find("no training run"), std::string::npos);

  // Every command queued wakes the run once; it answers what it takes.
  std::mutex mutex;
  std::condition_variable woken;
  int wakes = 0;
  inbox.open([&] {
    std::lock_guard<std::mutex> guard(mutex);
    ++wakes;
    woken.notify_one();
  });
  std::thread scheduler([&] {
    std::unique_lock<std::mutex> lock(mutex);
    woken.wait(lock, [&] { return wakes > 0; });
    for (auto& c : inbox.take())
      c.reply->set_value(
        {true, c.value.verb == admin_verb::plan ? "{\"plan\":1}" : "?"});
  });
  const auto reply = inbox.ask(parse_admin_command("plan", {}));
  scheduler.join();
  EXPECT_TRUE(reply.ok);
  EXPECT_EQ(reply.body, "{\"plan\":1}");
  EXPECT_EQ(wakes, 1);

  // Closing answers what is still queued.
  std::thread asker([&] {
    const auto late = inbox.ask(parse_admin_command("status", {}));
    EXPECT_FALSE(late.ok);
    EXPECT_NE(late.body.find("ended"), std::string::npos) << late.body;
  });
  while (inbox.waiting() == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  inbox.close();
  asker.join();
}

TEST(runtime_admin, answers_are_one_json_line) {
  const auto ok = nlohmann::json::parse(admin_ok("{\"a\":1}"));
  EXPECT_TRUE(ok["ok"].get<bool>());
  EXPECT_EQ(ok["result"]["a"], 1);
  const auto no = nlohmann::json::parse(admin_refusal("bad \xff\n"));
  EXPECT_FALSE(no["ok"].get<bool>());
  EXPECT_EQ(admin_refusal("x").find('\n'), std::string::npos);
}

TEST(runtime_admin, status_names_every_chip_and_the_policy) {
  auto job = std::make_shared<job_config>(parse_job(
    test::small_job_toml(1) +
      "[[nodes]]\nchips = [\"emulated:h100-sxm\", \"emulated:mi250x\"]\n",
    "status.toml"));
  plan p;
  replica_plan r;
  r.stages = {stage_plan{{0, 0}, 0, 3, false}, stage_plan{{0, 1}, 3, 6, true}};
  r.micro_batch_size = 2;
  r.micro_batches = 4;
  p.replicas = {r};
  rebalancer rb(job, p);
  run_status s;
  s.step = 7;
  s.steps = 20;
  s.generation = 2;
  s.paused = true;
  s.throttles[{0, 1}] = 2;
  const auto j = nlohmann::json::parse(status_json(*job, p, s, &rb.policy()));
  EXPECT_EQ(j["step"], 7);
  EXPECT_EQ(j["paused"], true);
  EXPECT_EQ(j["plan_generation"], 2);
  ASSERT_EQ(j["chips"].size(), 2u);
  EXPECT_EQ(j["chips"][1]["chip"], "0:1");
  EXPECT_EQ(j["chips"][1]["layers"], nlohmann::json::array({3, 6}));
  EXPECT_EQ(j["chips"][1]["throttle"], 2.0);
  EXPECT_EQ(j["chips"][1]["recompute"], "full");
  EXPECT_EQ(j["policy"]["mode"], "off");
}

} // namespace
} // namespace h2::runtime
