// The admin endpoint's decoder (runtime/admin.hpp): one request line from a
// client of the admin port, decoded, its seal checked under the admin token,
// the command parsed (the endpoint parses only sealed ones; here every
// decoded one is, since a mutated input cannot forge a seal), and the
// refusal the client would be sent. Input: the line.
#include "fuzz.hpp"

#include "h2/runtime/admin.hpp"

#include <memory>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  using namespace h2::runtime;
  static const auto token = std::make_shared<const h2::transport::job_secret>(
    "fuzzing-admin-token-0123456789");
  const auto line = h2::fuzz::as_text(data, size);
  try {
    const admin_request r = decode_admin_request(line);
    if (r.asks_session())
      return 0; // the endpoint answers its session, nothing else
    // The seeds are sealed under `token`: a seal accepted once is refused
    // the second time (a replay).
    h2::transport::control_verifier verifier(token);
    const auto type = admin_seal_type(r.command);
    const auto payload = admin_payload(r.session, r.args);
    if (verifier.accept(type, r.seal, payload))
      h2::fuzz::require(!verifier.accept(type, r.seal, payload),
                        "a replayed admin request is refused");
    // encode is decode's inverse on what decode accepts.
    const admin_request again = decode_admin_request(encode_admin_request(r));
    h2::fuzz::require(again.session == r.session &&
                        again.command == r.command && again.args == r.args &&
                        again.seal.seq == r.seal.seq &&
                        again.seal.mac == r.seal.mac,
                      "a decoded request encodes to the same request");
    const admin_command c = parse_admin_command(r.command, r.args);
    if (c.verb == admin_verb::throttle)
      h2::fuzz::require(c.factor > 0 && c.factor <= 1000,
                        "a throttle factor in (0, 1000]");
  } catch (const admin_error& e) {
    // What the endpoint answers (apps/admin_server.cpp): one JSON line,
    // whatever bytes the message quotes.
    const std::string answer = admin_refusal(e.what());
    h2::fuzz::require(answer.find('\n') == std::string::npos,
                      "a refusal is one line");
  } catch (const h2::internal_error& e) {
    h2::fuzz::finding("internal_error from outside bytes", e.what());
  } catch (const h2::error&) {
    // Documented, though the admin decoder only throws admin_error.
  }
  return 0;
}
