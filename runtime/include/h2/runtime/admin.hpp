// The admin protocol (docs/admin.md): what `h2-admin` sends to a running
// job's admin endpoint and what it gets back, and the commands it may give.
// Pure: encoding, decoding, sealing and parsing, no sockets and no actors
// (apps/ serves the endpoint, runtime::run_controller carries commands
// out).
//
// One request per connection, one JSON object on one line:
//   {"seq": N, "session": "<hex>", "command": "throttle",
//    "args": ["0:1", "2"], "mac": "<hex>"}
// sealed with HMAC-SHA256 under the admin token over the sender (0), the
// sequence number, "admin/<command>", the session and the arguments
// (transport::control_seal). The session is the endpoint's own random
// number, new in every process: a client asks for it first with the
// unsealed line {"command": "session"}. The endpoint refuses a wrong MAC
// (another token, a change after sealing, another run's session) and any
// sequence number at or below the last one it accepted (a replay). The
// answer is one line: {"ok": true, "result": ...} or
// {"ok": false, "error": "..."}.
#pragma once

#include "h2/core/chip_id.hpp"
#include "h2/core/error.hpp"
#include "h2/core/job.hpp"
#include "h2/transport/handshake.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace h2::runtime {

/// A request or command the endpoint refuses: malformed, unauthorised,
/// unknown, out of range, or not possible now. The message is what the
/// client is told.
class admin_error : public error {
public:
  using error::error;
};

/// Bytes one request line may take (a plan for many chips fits).
inline constexpr std::size_t max_admin_request_bytes = std::size_t{1} << 20;

/// The type a request's seal covers: "admin/<command>".
std::string admin_seal_type(std::string_view command);

/// What the seal of a request covers besides its type: the endpoint's
/// session and the arguments.
std::string admin_payload(std::string_view session,
                          const std::vector<std::string>& args);

/// The unsealed request for the endpoint's session, and its command.
inline constexpr std::string_view admin_session_query =
  R"({"command":"session"})";
inline constexpr std::string_view admin_session_command = "session";

/// A session: 32 lowercase hex digits (16 random bytes).
std::string make_admin_session();
bool is_admin_session(std::string_view s);

struct admin_request {
  transport::control_seal seal; ///< sender 0, the client's sequence number
  std::string session;          ///< the endpoint's, as the client asked
  std::string command;
  std::vector<std::string> args;

  /// {"command": "session"}: nothing sealed, the endpoint tells its
  /// session.
  bool asks_session() const {
    return command == admin_session_command && seal.mac.empty();
  }
};

/// The request `command args...` for the endpoint's `session`, sealed
/// under `token` with sequence number `seq` (h2-admin uses the wall clock
/// in nanoseconds, so that successive clients' numbers rise).
admin_request seal_admin_request(const transport::job_secret& token,
                                 std::uint64_t seq, std::string session,
                                 std::string command,
                                 std::vector<std::string> args);

/// One line (no newline) and back. decode throws admin_error("malformed
/// request: ...") for anything but a well-formed request or the session
/// query.
std::string encode_admin_request(const admin_request& r);
admin_request decode_admin_request(std::string_view line);

/// The answer lines.
std::string admin_ok(std::string_view result_json);
std::string admin_refusal(std::string_view message);

/// What h2-admin may ask.
enum class admin_verb {
  status,     ///< plan, per-chip metrics, policy state
  plan,       ///< the running plan, versioned
  rebalance,  ///< the policy's best plan now (--auto) or `plan_json`
  policy,     ///< set the policy's mode
  pause,      ///< hold at the next step boundary
  resume,     ///< go on after a pause
  checkpoint, ///< save at the next step boundary
  throttle,   ///< an emulated chip runs `factor` times slower
  stop,       ///< save (with [checkpoint]) and end at the next boundary
};

struct admin_command {
  admin_verb verb = admin_verb::status;
  bool best = false;     ///< rebalance --auto
  std::string plan_json; ///< rebalance --plan: the plan file's text
  bool restart = false;  ///< rebalance --plan ... --restart
  rebalance_mode mode = rebalance_mode::off; ///< policy
  chip_id chip;                              ///< throttle
  double factor = 1;                         ///< throttle
};

/// Parses a command and its arguments as h2-admin sends them:
///   status | plan | rebalance --auto | rebalance --plan JSON [--restart]
///   | policy auto|off | pause | resume | checkpoint
///   | throttle CHIP FACTOR (0 < FACTOR <= 1000) | stop
/// Throws admin_error naming what is wrong (unknown command, missing or
/// extra arguments, a value out of range). Chips are checked against the
/// job by whoever carries the command out.
admin_command parse_admin_command(const std::string& command,
                                  const std::vector<std::string>& args);

/// The scheduler's answer to one command.
struct admin_reply {
  bool ok = false;
  std::string body; ///< ok: JSON text; otherwise the error message
};

/// Hands admin commands, parsed once by the endpoint, from its thread to
/// the run in progress and the answers back. The run's scheduler opens it
/// with a wake-up the inbox calls after queueing each command (the
/// scheduler then takes them between its messages; nothing polls).
/// Thread-safe. Closed while no run trains.
class admin_inbox {
public:
  /// Longest ask() waits for an answer.
  static constexpr std::chrono::seconds timeout{10};

  struct command {
    admin_command value;
    std::shared_ptr<std::promise<admin_reply>> reply;
  };

  /// A run starts (open, with its wake-up) or ends (close: queued commands
  /// are refused, and the wake-up is dropped).
  void open(std::function<void()> wake);
  void close();

  /// Queues `c`, wakes the run and waits for the answer (at most
  /// `timeout`; a command not yet taken by then is withdrawn).
  admin_reply ask(admin_command c);

  /// The commands queued so far (the scheduler answers each).
  std::vector<command> take();

  /// How many commands wait to be taken.
  std::size_t waiting();

private:
  std::mutex mutex_;
  bool open_ = false;
  std::function<void()> wake_;
  std::vector<command> queue_;
};

/// The admin token: a file of at least 16 bytes (trailing white space
/// ignored) that group and others cannot read. Throws config_error at
/// `key` naming the file otherwise.
std::shared_ptr<const transport::job_secret>
load_admin_token(const std::string& path,
                 const std::string& key = "admin.token_file");

} // namespace h2::runtime
