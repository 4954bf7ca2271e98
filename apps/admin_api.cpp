#include "h2/apps/admin_api.hpp"

#include <nlohmann/json.hpp>

namespace h2::apps {

admin_api::admin_api(std::shared_ptr<const transport::job_secret> token,
                     std::shared_ptr<runtime::admin_inbox> inbox,
                     std::FILE* log)
    : token_(std::move(token)),
      inbox_(std::move(inbox)),
      log_(log),
      verifier_(token_),
      session_(runtime::make_admin_session()) {
}

metrics::http_route admin_api::route() {
  return {"/admin", "POST",
          [this](const metrics::http_call& call) { return handle(call); },
          true};
}

metrics::http_answer admin_api::refuse(int status, const std::string& peer,
                                       const std::string& message) {
  std::fprintf(log_, "h2: admin: refused %s: %s\n", peer.c_str(),
               message.c_str());
  std::fflush(log_);
  return {status, "application/json", runtime::admin_refusal(message)};
}

metrics::http_answer admin_api::handle(const metrics::http_call& call) {
  runtime::admin_request r;
  try {
    r = runtime::decode_admin_request(call.body);
  } catch (const runtime::admin_error& e) {
    return refuse(400, call.peer, e.what());
  }
  if (r.asks_session())
    return {200, "application/json",
            runtime::admin_ok(nlohmann::json{{"session", session_}}.dump())};
  if (r.session != session_)
    return refuse(401, call.peer,
                  "unauthorized: sealed for another run of the job (a "
                  "replay, or a stale session: ask for the session again)");
  if (r.seal.sender != 0 ||
      !verifier_.accept(runtime::admin_seal_type(r.command), r.seal,
                        runtime::admin_payload(session_, r.args)))
    return refuse(401, call.peer,
                  "unauthorized: wrong admin token, or a replayed request");
  runtime::admin_command command;
  try {
    command = runtime::parse_admin_command(r.command, r.args);
  } catch (const runtime::admin_error& e) {
    return refuse(400, call.peer, e.what());
  }
  const auto reply = inbox_->ask(std::move(command));
  std::string shown = r.command;
  if (r.command != "rebalance" || r.args.size() < 2) // not a whole plan
    for (const auto& a : r.args)
      shown += " " + a;
  else
    shown += " --plan <" + std::to_string(r.args[1].size()) + " bytes>";
  std::fprintf(log_, "h2: admin: %s from %s: %s\n", shown.c_str(),
               call.peer.c_str(), reply.ok ? "done" : reply.body.c_str());
  std::fflush(log_);
  if (!reply.ok)
    return {409, "application/json", runtime::admin_refusal(reply.body)};
  return {200, "application/json", runtime::admin_ok(reply.body)};
}

} // namespace h2::apps
