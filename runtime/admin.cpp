#include "h2/runtime/admin.hpp"

#include "h2/core/random.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace h2::runtime {

std::string admin_seal_type(std::string_view command) {
  return "admin/" + std::string(command);
}

std::string admin_payload(std::string_view session,
                          const std::vector<std::string>& args) {
  return std::string(session) + "/" + nlohmann::json(args).dump();
}

std::string make_admin_session() {
  unsigned char bytes[16];
  random_bytes(bytes, sizeof(bytes));
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

bool is_admin_session(std::string_view s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

admin_request seal_admin_request(const transport::job_secret& token,
                                 std::uint64_t seq, std::string session,
                                 std::string command,
                                 std::vector<std::string> args) {
  admin_request r;
  r.seal = transport::seal_control(token, admin_seal_type(command), 0, seq,
                                   admin_payload(session, args));
  r.session = std::move(session);
  r.command = std::move(command);
  r.args = std::move(args);
  return r;
}

std::string encode_admin_request(const admin_request& r) {
  return nlohmann::json{{"seq", r.seal.seq},
                        {"session", r.session},
                        {"command", r.command},
                        {"args", r.args},
                        {"mac", r.seal.mac}}
    .dump();
}

admin_request decode_admin_request(std::string_view line) {
  if (line.size() > max_admin_request_bytes)
    throw admin_error("malformed request: longer than " +
                      std::to_string(max_admin_request_bytes) + " bytes");
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw admin_error("malformed request: not a JSON object");
  admin_request r;
  if (j.size() == 1 && j.contains("command") &&
      j["command"] == admin_session_command) {
    r.command = admin_session_command;
    return r;
  }
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = j.find(key);
    if (it == j.end())
      throw admin_error(std::string("malformed request: no \"") + key + "\"");
    return *it;
  };
  const auto& seq = field("seq");
  if (!seq.is_number_unsigned())
    throw admin_error("malformed request: \"seq\" is not a positive integer");
  r.seal.seq = seq.get<std::uint64_t>();
  const auto& session = field("session");
  const auto& command = field("command");
  const auto& mac = field("mac");
  if (!session.is_string() || !command.is_string() || !mac.is_string())
    throw admin_error(
      "malformed request: \"session\", \"command\" and \"mac\" are strings");
  r.session = session.get<std::string>();
  r.command = command.get<std::string>();
  r.seal.mac = mac.get<std::string>();
  if (r.seal.mac.empty())
    throw admin_error("malformed request: an empty \"mac\"");
  const auto& args = field("args");
  if (!args.is_array())
    throw admin_error("malformed request: \"args\" is not an array");
  for (const auto& a : args) {
    if (!a.is_string())
      throw admin_error("malformed request: an argument is not a string");
    r.args.push_back(a.get<std::string>());
  }
  if (j.size() != 5)
    throw admin_error("malformed request: unknown fields");
  return r;
}

std::string admin_ok(std::string_view result_json) {
  auto result = nlohmann::json::parse(result_json, nullptr, false);
  return nlohmann::json{
    {"ok", true},
    {"result", result.is_discarded() ? nlohmann::json(result_json) : result}}
    .dump();
}

std::string admin_refusal(std::string_view message) {
  return nlohmann::json{{"ok", false}, {"error", message}}.dump(
    -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

namespace {

void expect_args(const std::string& command,
                 const std::vector<std::string>& args, std::size_t n,
                 const char* usage) {
  if (args.size() != n)
    throw admin_error(command + ": expected " + usage + ", got " +
                      std::to_string(args.size()) + " argument" +
                      (args.size() == 1 ? "" : "s"));
}

} // namespace

admin_command parse_admin_command(const std::string& command,
                                  const std::vector<std::string>& args) {
  admin_command c;
  if (command == "status" || command == "plan" || command == "pause" ||
      command == "resume" || command == "checkpoint" || command == "stop") {
    expect_args(command, args, 0, "no arguments");
    c.verb = command == "status"       ? admin_verb::status
             : command == "plan"       ? admin_verb::plan
             : command == "pause"      ? admin_verb::pause
             : command == "resume"     ? admin_verb::resume
             : command == "checkpoint" ? admin_verb::checkpoint
                                       : admin_verb::stop;
    return c;
  }
  if (command == "policy") {
    expect_args(command, args, 1, "auto or off");
    auto mode = parse_rebalance_mode(args[0]);
    if (!mode)
      throw admin_error("policy: expected auto or off, got \"" + args[0] +
                        "\"");
    c.verb = admin_verb::policy;
    c.mode = *mode;
    return c;
  }
  if (command == "throttle") {
    expect_args(command, args, 2, "CHIP FACTOR");
    auto chip = chip_id::parse(args[0]);
    if (!chip)
      throw admin_error("throttle: expected a chip id \"<node>:<index>\", "
                        "got \"" +
                        args[0] + "\"");
    double factor = 0;
    std::size_t used = 0;
    try {
      factor = std::stod(args[1], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != args[1].size() || !std::isfinite(factor) ||
        factor <= 0 || factor > 1000)
      throw admin_error("throttle: FACTOR must be a number in (0, 1000], "
                        "got \"" +
                        args[1] + "\"");
    c.verb = admin_verb::throttle;
    c.chip = *chip;
    c.factor = factor;
    return c;
  }
  if (command == "rebalance") {
    c.verb = admin_verb::rebalance;
    if (args.size() == 1 && args[0] == "--auto") {
      c.best = true;
      return c;
    }
    if ((args.size() == 2 || (args.size() == 3 && args[2] == "--restart")) &&
        args[0] == "--plan") {
      c.plan_json = args[1];
      c.restart = args.size() == 3;
      return c;
    }
    throw admin_error("rebalance: expected --auto or --plan FILE "
                      "[--restart]");
  }
  throw admin_error("unknown command \"" + command.substr(0, 64) +
                    "\" (status, plan, rebalance, policy, pause, resume, "
                    "checkpoint, throttle, stop)");
}

void admin_inbox::open(std::function<void()> wake) {
  std::lock_guard<std::mutex> guard(mutex_);
  open_ = true;
  wake_ = std::move(wake);
}

void admin_inbox::close() {
  std::vector<command> left;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    open_ = false;
    wake_ = nullptr;
    left.swap(queue_);
  }
  for (auto& c : left)
    c.reply->set_value({false, "the run ended before it could answer"});
}

admin_reply admin_inbox::ask(admin_command c) {
  auto reply = std::make_shared<std::promise<admin_reply>>();
  auto answer = reply->get_future();
  std::function<void()> wake;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (!open_)
      return {false, "no training run is in progress (it is starting, or "
                     "ending)"};
    queue_.push_back({std::move(c), reply});
    wake = wake_; // called unlocked: it may take locks of its own
  }
  if (wake)
    wake();
  if (answer.wait_for(timeout) != std::future_status::ready) {
    // Not taken yet: it never runs, as the client is told. (Taken: it
    // runs, and its answer goes nowhere.)
    std::lock_guard<std::mutex> guard(mutex_);
    std::erase_if(queue_, [&](const command& q) { return q.reply == reply; });
    return {false, "the scheduler did not answer within " +
                     std::to_string(timeout.count()) + " s; the command " +
                     "was not carried out unless it had started"};
  }
  return answer.get();
}

std::vector<admin_inbox::command> admin_inbox::take() {
  std::lock_guard<std::mutex> guard(mutex_);
  std::vector<command> out;
  out.swap(queue_);
  return out;
}

std::size_t admin_inbox::waiting() {
  std::lock_guard<std::mutex> guard(mutex_);
  return queue_.size();
}

std::shared_ptr<const transport::job_secret>
load_admin_token(const std::string& path, const std::string& key) {
  return std::make_shared<const transport::job_secret>(
    transport::read_token_file(path, key, "the admin token"));
}

} // namespace h2::runtime
