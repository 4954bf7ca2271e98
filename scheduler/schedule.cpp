#include "h2/scheduler/schedule.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <ostream>

namespace h2::scheduler {

namespace {

void check_shape(int stages, int micro_batches) {
  H2_ENFORCE(stages >= 1, "stages = ", stages);
  H2_ENFORCE(micro_batches >= 1, "micro_batches = ", micro_batches);
}

/// Appends the ops of one stage's list, knowing where the stage sits in the
/// pipeline (which recv/send ops exist).
class stage_builder {
public:
  stage_builder(int stage, int stages, std::vector<op>& out)
      : first_(stage == 0), last_(stage == stages - 1), out_(out) {}

  void forward(int mb) {
    if (!first_)
      out_.push_back({op_kind::recv_forward, mb});
    out_.push_back({op_kind::forward, mb});
    if (!last_)
      out_.push_back({op_kind::send_forward, mb});
  }

  void backward(int mb) {
    if (!last_)
      out_.push_back({op_kind::recv_backward, mb});
    out_.push_back({op_kind::backward, mb});
    if (!first_)
      out_.push_back({op_kind::send_backward, mb});
  }

private:
  bool first_;
  bool last_;
  std::vector<op>& out_;
};

/// Appends stage `stage`'s training ops under `kind`.
void fill_stage(schedule_kind kind, int stage, int stages, int micro_batches,
                stage_builder& b) {
  switch (kind) {
    case schedule_kind::gpipe:
      for (int i = 0; i < micro_batches; ++i)
        b.forward(i);
      for (int i = 0; i < micro_batches; ++i)
        b.backward(i);
      return;
    case schedule_kind::one_f_one_b: {
      // The first backward reaches stage s only after the last stage has
      // forwarded micro-batch 0, i.e. after stage s forwarded stages - s
      // micro-batches. The warm-up fills that window; the steady state then
      // trades one forward for one backward, so at most stages - s
      // activations are held at once.
      int warmup = std::min(stages - stage - 1, micro_batches);
      int fwd = 0;
      int bwd = 0;
      while (fwd < warmup)
        b.forward(fwd++);
      while (fwd < micro_batches) {
        b.forward(fwd++);
        b.backward(bwd++);
      }
      while (bwd < micro_batches)
        b.backward(bwd++);
      return;
    }
  }
  // No default above, so -Wswitch names a new enumerator left unhandled.
  H2_ENFORCE(false, "unknown schedule_kind ", static_cast<int>(kind));
}

} // namespace

std::string_view to_string(op_kind k) noexcept {
  switch (k) {
    case op_kind::recv_forward:
      return "recv_forward";
    case op_kind::forward:
      return "forward";
    case op_kind::send_forward:
      return "send_forward";
    case op_kind::recv_backward:
      return "recv_backward";
    case op_kind::backward:
      return "backward";
    case op_kind::send_backward:
      return "send_backward";
  }
  return "unknown";
}

std::ostream& operator<<(std::ostream& out, const op& x) {
  return out << to_string(x.kind) << '(' << x.micro_batch << ')';
}

schedule make_schedule(schedule_kind kind, int stages, int micro_batches) {
  check_shape(stages, micro_batches);
  schedule result{kind, stages, micro_batches, {}, false};
  result.ops.resize(stages);
  for (int s = 0; s < stages; ++s) {
    auto& list = result.ops[s];
    // Every micro-batch contributes at most three ops per direction.
    list.reserve(6 * static_cast<size_t>(micro_batches));
    stage_builder b{s, stages, list};
    fill_stage(kind, s, stages, micro_batches, b);
  }
  return result;
}

schedule make_forward_schedule(int stages, int micro_batches) {
  check_shape(stages, micro_batches);
  schedule result{schedule_kind::gpipe, stages, micro_batches, {}, true};
  result.ops.resize(stages);
  for (int s = 0; s < stages; ++s) {
    result.ops[s].reserve(3 * static_cast<size_t>(micro_batches));
    stage_builder b{s, stages, result.ops[s]};
    for (int i = 0; i < micro_batches; ++i)
      b.forward(i);
  }
  return result;
}

int in_flight_bound(schedule_kind kind, int stages, int stage,
                    int micro_batches) {
  check_shape(stages, micro_batches);
  H2_ENFORCE(stage >= 0 && stage < stages, "stage = ", stage,
             ", stages = ", stages);
  switch (kind) {
    case schedule_kind::gpipe:
      return micro_batches;
    case schedule_kind::one_f_one_b:
      return std::min(stages - stage, micro_batches);
  }
  H2_ENFORCE(false, "unknown schedule_kind ", static_cast<int>(kind));
  return 0; // unreachable: H2_ENFORCE(false) throws
}

double bubble_fraction(int stages, int micro_batches) {
  check_shape(stages, micro_batches);
  return static_cast<double>(stages - 1) / (micro_batches + stages - 1);
}

} // namespace h2::scheduler
