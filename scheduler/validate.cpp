#include "h2/scheduler/validate.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>

namespace h2::scheduler {

namespace {

/// Where a stage sits in the pipeline: which recv/send ops it must have.
struct stage_position {
  int stage;
  bool first;
  bool last;
};

/// True if `list[at]` exists and is `expected`.
bool op_at(const std::vector<op>& list, std::ptrdiff_t at, op expected) {
  return at >= 0 && at < static_cast<std::ptrdiff_t>(list.size()) &&
         list[static_cast<size_t>(at)] == expected;
}

/// Checks op `j` of a stage's list against the op semantics (schedule.hpp):
/// recv ops right before their compute op, send ops right after it, none on
/// the pipeline's ends, every micro-batch forwarded (and backwarded) once,
/// forward first. `forwarded` / `backwarded` record which micro-batches have
/// been seen so far.
void check_op(const schedule& sc, stage_position pos,
              const std::vector<op>& list, std::ptrdiff_t j,
              std::vector<char>& forwarded, std::vector<char>& backwarded) {
  const op& x = list[static_cast<size_t>(j)];
  const int s = pos.stage;
  const int mb = x.micro_batch;
  H2_ENFORCE(mb >= 0 && mb < sc.micro_batches, "stage ", s, ", op ", j, " (", x,
             "): micro-batch ", mb, " outside [0, ", sc.micro_batches, ")");
  // Every message below starts with where the op is.
  const std::string where = detail::concat("stage ", s, ", op ", j, " (", x,
                                           "), micro-batch ", mb, ": ");
  const bool is_backward_op = x.kind == op_kind::recv_backward ||
                              x.kind == op_kind::backward ||
                              x.kind == op_kind::send_backward;
  H2_ENFORCE(!(sc.forward_only && is_backward_op), where,
             "backward op in a forward-only", " schedule");
  switch (x.kind) {
    case op_kind::recv_forward:
      H2_ENFORCE(!pos.first, where, "the first stage receives no",
                 " activations");
      H2_ENFORCE(op_at(list, j + 1, {op_kind::forward, mb}), where,
                 "recv_forward not followed by its forward");
      return;
    case op_kind::forward:
      H2_ENFORCE(!forwarded[mb], where, "forwarded twice");
      H2_ENFORCE(pos.first || op_at(list, j - 1, {op_kind::recv_forward, mb}),
                 where, "forward without recv_forward right before it");
      H2_ENFORCE(pos.last || op_at(list, j + 1, {op_kind::send_forward, mb}),
                 where, "forward without send_forward right after it");
      forwarded[mb] = 1;
      return;
    case op_kind::send_forward:
      H2_ENFORCE(!pos.last, where, "the last stage sends no", " activations");
      H2_ENFORCE(op_at(list, j - 1, {op_kind::forward, mb}), where,
                 "send_forward not right after its forward");
      return;
    case op_kind::recv_backward:
      H2_ENFORCE(!pos.last, where, "the last stage receives no", " gradients");
      H2_ENFORCE(op_at(list, j + 1, {op_kind::backward, mb}), where,
                 "recv_backward not followed by its backward");
      return;
    case op_kind::backward:
      H2_ENFORCE(forwarded[mb], where, "backward before forward");
      H2_ENFORCE(!backwarded[mb], where, "backwarded twice");
      H2_ENFORCE(pos.last || op_at(list, j - 1, {op_kind::recv_backward, mb}),
                 where, "backward without recv_backward right before it");
      H2_ENFORCE(pos.first || op_at(list, j + 1, {op_kind::send_backward, mb}),
                 where, "backward without send_backward right after it");
      backwarded[mb] = 1;
      return;
    case op_kind::send_backward:
      H2_ENFORCE(!pos.first, where, "the first stage sends no", " gradients");
      H2_ENFORCE(op_at(list, j - 1, {op_kind::backward, mb}), where,
                 "send_backward not right after its backward");
      return;
  }
  H2_ENFORCE(false, "stage ", s, ", op ", j, ": unknown op_kind ",
             static_cast<int>(x.kind));
}

/// The per-stage rules: structure, exactly-once, forward before backward.
void check_stage(const schedule& sc, int s) {
  const auto& list = sc.ops[static_cast<size_t>(s)];
  const stage_position pos{s, s == 0, s == sc.stages - 1};
  std::vector<char> forwarded(static_cast<size_t>(sc.micro_batches), 0);
  std::vector<char> backwarded(static_cast<size_t>(sc.micro_batches), 0);
  for (std::ptrdiff_t j = 0; j < static_cast<std::ptrdiff_t>(list.size()); ++j)
    check_op(sc, pos, list, j, forwarded, backwarded);
  for (int mb = 0; mb < sc.micro_batches; ++mb) {
    H2_ENFORCE(forwarded[mb], "stage ", s, ", op ", list.size(),
               " (end of list), micro-batch ", mb, ": never forwarded");
    H2_ENFORCE(sc.forward_only || backwarded[mb], "stage ", s, ", op ",
               list.size(), " (end of list), micro-batch ", mb,
               ": never backwarded");
  }
}

/// The activation bound of stage `s`.
void check_in_flight(const schedule& sc, int s) {
  const int bound = in_flight_bound(sc.kind, sc.stages, s, sc.micro_batches);
  const auto& list = sc.ops[static_cast<size_t>(s)];
  int held = 0;
  for (size_t j = 0; j < list.size(); ++j) {
    const op& x = list[j];
    if (x.kind == op_kind::forward)
      ++held;
    else if (x.kind == op_kind::backward)
      --held;
    H2_ENFORCE(held <= bound, "stage ", s, ", op ", j, " (", x,
               "), micro-batch ", x.micro_batch, ": holds ", held,
               " activations in flight, above the ", to_string(sc.kind),
               " bound ", bound);
  }
}

/// Runs every stage's list in order, a recv completing only after the
/// neighbour's matching send; throws naming every stage that is stuck.
/// Assumes check_stage() passed, so every recv has exactly one matching send.
void check_deadlock_free(const schedule& sc) {
  const auto p = static_cast<size_t>(sc.stages);
  const auto m = static_cast<size_t>(sc.micro_batches);
  std::vector<size_t> next(p, 0);
  // sent_forward[s][i]: stage s has executed send_forward(i); same for
  // backward.
  std::vector<std::vector<char>> sent_forward(p, std::vector<char>(m, 0));
  std::vector<std::vector<char>> sent_backward(p, std::vector<char>(m, 0));
  // Each sweep runs every stage as far as it can; a sweep without progress
  // means every unfinished stage waits on a send that will never happen.
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t s = 0; s < p; ++s) {
      const auto& list = sc.ops[s];
      for (; next[s] < list.size(); ++next[s], progress = true) {
        const op& x = list[next[s]];
        const auto mb = static_cast<size_t>(x.micro_batch);
        if (x.kind == op_kind::recv_forward && !sent_forward[s - 1][mb])
          break;
        if (x.kind == op_kind::recv_backward && !sent_backward[s + 1][mb])
          break;
        if (x.kind == op_kind::send_forward)
          sent_forward[s][mb] = 1;
        if (x.kind == op_kind::send_backward)
          sent_backward[s][mb] = 1;
      }
    }
  }
  std::ostringstream stuck;
  for (size_t s = 0; s < p; ++s) {
    if (next[s] == sc.ops[s].size())
      continue;
    const op& x = sc.ops[s][next[s]];
    const bool fwd = x.kind == op_kind::recv_forward;
    stuck << "; stage " << s << ", op " << next[s] << " (" << x
          << "), micro-batch " << x.micro_batch << " waits for "
          << (fwd ? "send_forward" : "send_backward") << "(" << x.micro_batch
          << ") of stage " << (fwd ? s - 1 : s + 1);
  }
  H2_ENFORCE(stuck.tellp() == 0, "deadlock", stuck.str());
}

} // namespace

void validate(const schedule& sc) {
  H2_ENFORCE(sc.stages >= 1, "stages = ", sc.stages);
  H2_ENFORCE(sc.micro_batches >= 1, "micro_batches = ", sc.micro_batches);
  H2_ENFORCE(sc.ops.size() == static_cast<size_t>(sc.stages), "ops has ",
             sc.ops.size(), " stage lists for ", sc.stages, " stages");
  for (int s = 0; s < sc.stages; ++s)
    check_stage(sc, s);
  for (int s = 0; s < sc.stages; ++s)
    check_in_flight(sc, s);
  check_deadlock_free(sc);
}

int peak_in_flight(const schedule& sc, int stage) {
  H2_ENFORCE(stage >= 0 && static_cast<size_t>(stage) < sc.ops.size(),
             "stage = ", stage, ", stage lists = ", sc.ops.size());
  int held = 0;
  int peak = 0;
  for (const op& x : sc.ops[static_cast<size_t>(stage)]) {
    if (x.kind == op_kind::forward)
      peak = std::max(peak, ++held);
    else if (x.kind == op_kind::backward)
      --held;
  }
  return peak;
}

} // namespace h2::scheduler
