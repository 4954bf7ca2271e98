#include "h2/scheduler/validate.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>

namespace h2::scheduler {

namespace {

/// What has happened to each (chunk, micro-batch) so far.
struct progress {
  explicit progress(const schedule& sc)
      : m(static_cast<std::size_t>(sc.micro_batches)),
        forwarded(static_cast<std::size_t>(sc.chunks()) * m, 0),
        backwarded(forwarded.size(), 0),
        weighted(forwarded.size(), 0) {}

  std::size_t at(int chunk, int mb) const {
    return static_cast<std::size_t>(chunk) * m + static_cast<std::size_t>(mb);
  }

  std::size_t m;
  std::vector<char> forwarded;
  std::vector<char> backwarded; ///< fused backward or B done
  std::vector<char> weighted;   ///< W done (split backward)
};

/// Checks of one chip's list against the op semantics (schedule.hpp).
class list_checker {
public:
  list_checker(const schedule& sc, int chip, progress& done)
      : sc_(sc),
        chip_(chip),
        list_(sc.ops[static_cast<std::size_t>(chip)]),
        done_(done),
        split_(splits_backward(sc.kind)) {}

  void run() {
    for (std::ptrdiff_t j = 0; j < static_cast<std::ptrdiff_t>(list_.size());
         ++j)
      check(j);
    for (int c = 0; c < sc_.chunks(); ++c) {
      if (chip_of(c) != chip_)
        continue;
      for (int mb = 0; mb < sc_.micro_batches; ++mb) {
        const auto i = done_.at(c, mb);
        const auto end = detail::concat("chip ", chip_, ", op ", list_.size(),
                                        " (end of list), chunk ", c,
                                        ", micro-batch ", mb, ": ");
        H2_ENFORCE(done_.forwarded[i], end, "never forwarded");
        H2_ENFORCE(sc_.forward_only || done_.backwarded[i], end,
                   "never backwarded");
        H2_ENFORCE(sc_.forward_only || !split_ || done_.weighted[i], end,
                   "B without its W");
      }
    }
  }

private:
  int chip_of(int chunk) const {
    return sc_.layout.chunk_chip[static_cast<std::size_t>(chunk)];
  }
  /// True if chunk `neighbour` exists and lives on another chip than `chunk`.
  bool elsewhere(int chunk, int neighbour) const {
    return neighbour >= 0 && neighbour < sc_.chunks() &&
           chip_of(neighbour) != chip_of(chunk);
  }
  bool op_at(std::ptrdiff_t at, op expected) const {
    return at >= 0 && at < static_cast<std::ptrdiff_t>(list_.size()) &&
           list_[static_cast<std::size_t>(at)] == expected;
  }
  bool backward_at(std::ptrdiff_t at, int chunk, int mb) const {
    return op_at(at, {op_kind::backward, mb, chunk}) ||
           op_at(at, {op_kind::backward_input, mb, chunk});
  }

  void check(std::ptrdiff_t j) {
    const op& x = list_[static_cast<std::size_t>(j)];
    const int c = x.chunk;
    const int mb = x.micro_batch;
    const auto head = detail::concat("chip ", chip_, ", op ", j, " (", x, ")");
    H2_ENFORCE(c >= 0 && c < sc_.chunks(), head, ": chunk ", c, " outside [0, ",
               sc_.chunks(), ")");
    H2_ENFORCE(mb >= 0 && mb < sc_.micro_batches, head, ": micro-batch ", mb,
               " outside [0, ", sc_.micro_batches, ")");
    const auto where =
      detail::concat(head, ", chunk ", c, ", micro-batch ", mb, ": ");
    H2_ENFORCE(chip_of(c) == chip_, where, "chunk ", c, " is held by chip ",
               chip_of(c), ", not chip ", chip_);
    const bool backward_op =
      x.kind == op_kind::recv_backward || x.kind == op_kind::backward ||
      x.kind == op_kind::send_backward || x.kind == op_kind::backward_input ||
      x.kind == op_kind::backward_weight;
    H2_ENFORCE(!(sc_.forward_only && backward_op), where,
               "backward op in a forward-only", " schedule");
    const auto i = done_.at(c, mb);
    switch (x.kind) {
      case op_kind::recv_forward:
        H2_ENFORCE(elsewhere(c, c - 1), where,
                   "receives activations from no other chip");
        H2_ENFORCE(op_at(j + 1, {op_kind::forward, mb, c}), where,
                   "recv_forward not followed by its forward");
        return;
      case op_kind::forward:
        H2_ENFORCE(!done_.forwarded[i], where, "forwarded twice");
        H2_ENFORCE(!elsewhere(c, c - 1) ||
                     op_at(j - 1, {op_kind::recv_forward, mb, c}),
                   where, "forward without recv_forward right before it");
        H2_ENFORCE(
          c == 0 || elsewhere(c, c - 1) || done_.forwarded[done_.at(c - 1, mb)],
          where, "forward before chunk ", c - 1, "'s forward on the same chip");
        H2_ENFORCE(!elsewhere(c, c + 1) ||
                     op_at(j + 1, {op_kind::send_forward, mb, c}),
                   where, "forward without send_forward right after it");
        done_.forwarded[i] = 1;
        return;
      case op_kind::send_forward:
        H2_ENFORCE(elsewhere(c, c + 1), where,
                   "sends activations to no other chip");
        H2_ENFORCE(op_at(j - 1, {op_kind::forward, mb, c}), where,
                   "send_forward not right after its forward");
        return;
      case op_kind::recv_backward:
        H2_ENFORCE(elsewhere(c, c + 1), where,
                   "receives gradients from no other chip");
        H2_ENFORCE(backward_at(j + 1, c, mb), where,
                   "recv_backward not followed by its backward");
        return;
      case op_kind::backward:
      case op_kind::backward_input:
        H2_ENFORCE((x.kind == op_kind::backward_input) == split_, where,
                   to_string(sc_.kind),
                   split_ ? " splits the backward into backward_input and "
                            "backward_weight"
                          : " runs the fused backward");
        H2_ENFORCE(done_.forwarded[i], where, "backward before forward");
        H2_ENFORCE(!done_.backwarded[i], where, "backwarded twice");
        H2_ENFORCE(!elsewhere(c, c + 1) ||
                     op_at(j - 1, {op_kind::recv_backward, mb, c}),
                   where, "backward without recv_backward right before it");
        H2_ENFORCE(c + 1 == sc_.chunks() || elsewhere(c, c + 1) ||
                     done_.backwarded[done_.at(c + 1, mb)],
                   where, "backward before chunk ", c + 1,
                   "'s backward on the same chip");
        H2_ENFORCE(!elsewhere(c, c - 1) ||
                     op_at(j + 1, {op_kind::send_backward, mb, c}),
                   where, "backward without send_backward right after it");
        done_.backwarded[i] = 1;
        return;
      case op_kind::send_backward:
        H2_ENFORCE(elsewhere(c, c - 1), where,
                   "sends gradients to no other chip");
        H2_ENFORCE(backward_at(j - 1, c, mb), where,
                   "send_backward not right after its backward");
        return;
      case op_kind::backward_weight:
        H2_ENFORCE(split_, where, to_string(sc_.kind),
                   " runs the fused backward");
        H2_ENFORCE(done_.backwarded[i], where, "W before its B");
        H2_ENFORCE(!done_.weighted[i], where, "W twice");
        done_.weighted[i] = 1;
        return;
    }
    H2_ENFORCE(false, where, "unknown op_kind ", static_cast<int>(x.kind));
  }

  const schedule& sc_;
  int chip_;
  const std::vector<op>& list_;
  progress& done_;
  bool split_;
};

/// True for the ops after which a micro-batch's chunk activations are
/// released.
bool releases(const schedule& sc, op_kind k) {
  return k == op_kind::backward_weight ||
         (k == op_kind::backward && !splits_backward(sc.kind));
}

/// The activation bound of chip `k`.
void check_in_flight(const schedule& sc, int k) {
  const int bound =
    sc.forward_only ? sc.micro_batches * sc.layout.chunks_of(k)
                    : in_flight_bound(sc.kind, sc.layout, k, sc.micro_batches);
  const auto& list = sc.ops[static_cast<size_t>(k)];
  int held = 0;
  for (size_t j = 0; j < list.size(); ++j) {
    const op& x = list[j];
    if (x.kind == op_kind::forward)
      ++held;
    else if (releases(sc, x.kind))
      --held;
    H2_ENFORCE(held <= bound, "chip ", k, ", op ", j, " (", x, "), chunk ",
               x.chunk, ", micro-batch ", x.micro_batch, ": holds ", held,
               " activations in flight, above the ", to_string(sc.kind),
               " bound ", bound);
  }
}

/// Runs every chip's list in order, a recv completing only after the
/// matching send; throws naming every chip that is stuck. Assumes the
/// per-chip checks passed, so every recv has exactly one matching send.
void check_deadlock_free(const schedule& sc) {
  const auto p = static_cast<size_t>(sc.chips());
  const progress shape(sc);
  std::vector<size_t> next(p, 0);
  // sent_forward[at(c, i)]: chunk c's send_forward(i) has run; same for
  // backward.
  std::vector<char> sent_forward(shape.forwarded.size(), 0);
  std::vector<char> sent_backward(shape.forwarded.size(), 0);
  // Each sweep runs every chip as far as it can; a sweep without progress
  // means every unfinished chip waits on a send that will never happen.
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t k = 0; k < p; ++k) {
      const auto& list = sc.ops[k];
      for (; next[k] < list.size(); ++next[k], moved = true) {
        const op& x = list[next[k]];
        if (x.kind == op_kind::recv_forward &&
            !sent_forward[shape.at(x.chunk - 1, x.micro_batch)])
          break;
        if (x.kind == op_kind::recv_backward &&
            !sent_backward[shape.at(x.chunk + 1, x.micro_batch)])
          break;
        if (x.kind == op_kind::send_forward)
          sent_forward[shape.at(x.chunk, x.micro_batch)] = 1;
        if (x.kind == op_kind::send_backward)
          sent_backward[shape.at(x.chunk, x.micro_batch)] = 1;
      }
    }
  }
  std::ostringstream stuck;
  for (size_t k = 0; k < p; ++k) {
    if (next[k] == sc.ops[k].size())
      continue;
    const op& x = sc.ops[k][next[k]];
    const bool fwd = x.kind == op_kind::recv_forward;
    const int from = fwd ? x.chunk - 1 : x.chunk + 1;
    stuck << "; chip " << k << ", op " << next[k] << " (" << x << ") waits for "
          << (fwd ? "send_forward" : "send_backward") << "(" << x.micro_batch
          << ") of chunk " << from << " on chip "
          << sc.layout.chunk_chip[static_cast<size_t>(from)];
  }
  H2_ENFORCE(stuck.tellp() == 0, "deadlock", stuck.str());
}

} // namespace

void validate(const schedule& sc) {
  H2_ENFORCE(sc.chips() >= 1, "chips = ", sc.chips());
  H2_ENFORCE(sc.micro_batches >= 1, "micro_batches = ", sc.micro_batches);
  H2_ENFORCE(sc.ops.size() == static_cast<size_t>(sc.chips()), "ops has ",
             sc.ops.size(), " chip lists for ", sc.chips(), " chips");
  if (sc.forward_only) {
    for (int chip : sc.layout.chunk_chip)
      H2_ENFORCE(chip >= 0 && chip < sc.chips(), "a chunk on chip ", chip,
                 " of a ", sc.chips(), "-chip pipeline");
  } else {
    const auto problem = layout_problem(sc.kind, sc.layout, sc.micro_batches);
    H2_ENFORCE(problem.empty(), problem);
  }
  progress done(sc);
  for (int k = 0; k < sc.chips(); ++k)
    list_checker(sc, k, done).run();
  for (int k = 0; k < sc.chips(); ++k)
    check_in_flight(sc, k);
  check_deadlock_free(sc);
}

int peak_in_flight(const schedule& sc, int chip) {
  H2_ENFORCE(chip >= 0 && static_cast<size_t>(chip) < sc.ops.size(),
             "chip = ", chip, ", chip lists = ", sc.ops.size());
  int held = 0;
  int peak = 0;
  for (const op& x : sc.ops[static_cast<size_t>(chip)]) {
    if (x.kind == op_kind::forward)
      peak = std::max(peak, ++held);
    else if (releases(sc, x.kind))
      --held;
  }
  return peak;
}

} // namespace h2::scheduler
