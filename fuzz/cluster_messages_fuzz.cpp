// The join and control messages between the nodes of a job
// (actors/cluster_protocol.hpp): what another process's CAF middleman hands
// the coordinator or a node actor, deserialised as the sealed type it
// claims, then checked as the receiving actor checks it (the join proof;
// control_verifier over the message's payload). The first byte picks the
// type, the rest is CAF's binary form of it. The seeds are sealed with the
// secret below, so their checks pass once; a mutated input cannot forge a
// seal, and a seal that passed must not pass again (a replay).
#include "fuzz.hpp"

#include "cluster_protocol.hpp"

#include <caf/binary_deserializer.hpp>

#include <memory>

namespace {

using namespace h2;
using namespace h2::actors;

/// The types a peer may send sealed or proven (docs/transport.md, "Control
/// messages"), as the first byte of an input names them.
enum class message : std::uint8_t {
  join = 0,       ///< (join_atom, node_join): coordinator
  assignment = 1, ///< (assign_atom, node_assignment): node
  seal = 2,       ///< attach, heartbeats, stop, finish: (atom, control_seal)
  abort = 3,      ///< (abort_atom, uint8 code, why, control_seal): node
  withdraw = 4,   ///< (withdraw_atom, why, control_seal): coordinator
};
constexpr int message_types = 5;

std::shared_ptr<const transport::job_secret> secret() {
  static auto s =
    std::make_shared<const transport::job_secret>("fuzzing-secret-0123456789");
  return s;
}

/// Checks `seal` over `payload` as the receiving actor does, and that a
/// seal accepted once is refused the second time.
void check_seal(std::string_view type, const transport::control_seal& seal,
                const std::string& payload) {
  transport::control_verifier verifier(secret());
  if (verifier.accept(type, seal, payload))
    fuzz::require(!verifier.accept(type, seal, payload),
                  "a replayed control message is refused");
}

/// Deserialises the input as `xs...` as CAF's middleman would; false when
/// CAF refuses the bytes (a caf::error, which the middleman drops).
template <class... Ts>
bool deserialise(const std::uint8_t* data, std::size_t size, Ts&... xs) {
  caf::execution_unit* no_context = nullptr;
  caf::binary_deserializer source(no_context,
                                  reinterpret_cast<const char*>(data), size);
  return !source(xs...);
}

void check_join(const std::uint8_t* data, std::size_t size) {
  node_join j;
  if (!deserialise(data, size, j))
    return;
  // The coordinator's check (coordinator.cpp) of the proof of the nonce it
  // handed out.
  (void)transport::join_proof_valid(*secret(), j.nonce, j.rank, j.proof);
}

void check_assignment(const std::uint8_t* data, std::size_t size) {
  node_assignment a;
  if (!deserialise(data, size, a))
    return;
  check_seal(assign_order, a.seal, assignment_payload(a));
}

void check_bare_seal(const std::uint8_t* data, std::size_t size) {
  transport::control_seal seal;
  if (!deserialise(data, size, seal))
    return;
  for (auto type : {node_attach, node_heartbeat, stop_request,
                    coordinator_heartbeat, finish_order})
    check_seal(type, seal, "");
}

void check_abort(const std::uint8_t* data, std::size_t size) {
  std::uint8_t code = 0;
  std::string why;
  transport::control_seal seal;
  if (!deserialise(data, size, code, why, seal))
    return;
  check_seal(abort_order, seal, abort_payload(code, why));
}

void check_withdraw(const std::uint8_t* data, std::size_t size) {
  std::string why;
  transport::control_seal seal;
  if (!deserialise(data, size, why, seal))
    return;
  check_seal(node_withdraw, seal, why);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < 1)
    return 0;
  const auto* body = data + 1;
  const std::size_t body_size = size - 1;
  h2::fuzz::decodes([&] {
    switch (static_cast<message>(data[0] % message_types)) {
      case message::join:
        check_join(body, body_size);
        break;
      case message::assignment:
        check_assignment(body, body_size);
        break;
      case message::seal:
        check_bare_seal(body, body_size);
        break;
      case message::abort:
        check_abort(body, body_size);
        break;
      case message::withdraw:
        check_withdraw(body, body_size);
        break;
    }
  });
  return 0;
}
