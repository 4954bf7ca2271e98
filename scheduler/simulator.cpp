#include "h2/scheduler/simulator.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/validate.hpp"

#include <algorithm>

namespace h2::scheduler {

namespace {

/// What the event loop reports per op (nothing, for the planner's fast
/// path).
struct no_recorder {
  void compute(int, interval_kind, int, int, double, double) {}
  void wait(int, int, double, double) {}
};

struct interval_recorder {
  int replica;
  std::vector<timeline_interval>* out;
  std::vector<stage_outcome>* chips;

  void compute(int k, interval_kind kind, int mb, int chunk, double start,
               double end) {
    auto& o = (*chips)[static_cast<std::size_t>(k)];
    (kind == interval_kind::forward ? o.forward_seconds : o.backward_seconds) +=
      end - start;
    if (out != nullptr)
      out->push_back({replica, k, kind, mb, chunk, start, end});
  }
  void wait(int k, int mb, double start, double end) {
    (*chips)[static_cast<std::size_t>(k)].wait_seconds += end - start;
    if (out != nullptr && end > start)
      out->push_back({replica, k, interval_kind::wait, mb, -1, start, end});
  }
};

/// Per-chunk costs of one run of the event loop (each points to one value
/// per chunk; `input` and `weight` are read only for split backwards).
struct chunk_costs {
  const double* forward;
  const double* backward;
  const double* input;
  const double* weight;
  const double* activation_link;
  const double* gradient_link;
};

/// Buffers of one run of the event loop.
struct loop_state {
  std::vector<double>& clock;         ///< per chip
  std::vector<double>& sent_forward;  ///< [chunk * m + mb], -1: not yet
  std::vector<double>& sent_backward; ///< [chunk * m + mb], -1: not yet
  std::vector<std::size_t>& next;
  std::vector<char>& blocked;
  std::vector<int>& ready;
};

/// Runs every chip's op list; a chip blocked on a receive resumes when the
/// sending chip sends. Returns each chip's clock at its list's end in
/// state.clock.
template <class Recorder>
void run_lists(const schedule& sc, const chunk_costs& cost, loop_state& st,
               Recorder& rec) {
  const auto p = static_cast<std::size_t>(sc.chips());
  const auto m = static_cast<std::size_t>(sc.micro_batches);
  const auto chunks = static_cast<std::size_t>(sc.chunks());
  const auto& owner = sc.layout.chunk_chip;
  st.clock.assign(p, 0.0);
  st.sent_forward.assign(chunks * m, -1.0);
  st.sent_backward.assign(chunks * m, -1.0);
  st.next.assign(p, 0);
  st.blocked.assign(p, 0);
  st.ready.clear();
  for (std::size_t k = p; k-- > 0;)
    st.ready.push_back(static_cast<int>(k));
  auto wake = [&](int chunk) {
    const auto k =
      static_cast<std::size_t>(owner[static_cast<std::size_t>(chunk)]);
    if (st.blocked[k]) {
      st.blocked[k] = 0;
      st.ready.push_back(static_cast<int>(k));
    }
  };
  std::size_t finished = 0;
  while (!st.ready.empty()) {
    const auto k = static_cast<std::size_t>(st.ready.back());
    st.ready.pop_back();
    const auto& list = sc.ops[k];
    double clock = st.clock[k];
    std::size_t j = st.next[k];
    for (; j < list.size(); ++j) {
      const op& x = list[j];
      const auto c = static_cast<std::size_t>(x.chunk);
      const auto mb = static_cast<std::size_t>(x.micro_batch);
      auto compute = [&](interval_kind kind, double seconds) {
        rec.compute(static_cast<int>(k), kind, x.micro_batch, x.chunk, clock,
                    clock + seconds);
        clock += seconds;
      };
      auto receive = [&](double sent, double link) {
        if (sent < 0)
          return false;
        const double arrival = sent + link;
        if (arrival > clock) {
          rec.wait(static_cast<int>(k), x.micro_batch, clock, arrival);
          clock = arrival;
        }
        return true;
      };
      bool stop = false;
      switch (x.kind) {
        case op_kind::recv_forward:
          stop = !receive(st.sent_forward[(c - 1) * m + mb],
                          cost.activation_link[c]);
          break;
        case op_kind::recv_backward:
          stop =
            !receive(st.sent_backward[(c + 1) * m + mb], cost.gradient_link[c]);
          break;
        case op_kind::forward:
          compute(interval_kind::forward, cost.forward[c]);
          break;
        case op_kind::backward:
          compute(interval_kind::backward, cost.backward[c]);
          break;
        case op_kind::backward_input:
          compute(interval_kind::backward_input, cost.input[c]);
          break;
        case op_kind::backward_weight:
          compute(interval_kind::backward_weight, cost.weight[c]);
          break;
        case op_kind::send_forward:
          st.sent_forward[c * m + mb] = clock;
          wake(x.chunk + 1);
          break;
        case op_kind::send_backward:
          st.sent_backward[c * m + mb] = clock;
          wake(x.chunk - 1);
          break;
      }
      if (stop)
        break;
    }
    st.clock[k] = clock;
    st.next[k] = j;
    if (j < list.size())
      st.blocked[k] = 1;
    else
      ++finished;
  }
  H2_ENFORCE(finished == p, "the op lists deadlock (", p - finished,
             " chips never finish)");
}

/// The largest bytes of chunk activations chip `k` holds at once.
double peak_held_bytes(const schedule& sc, int k,
                       const std::vector<simulated_stage>& chunks) {
  const bool split = splits_backward(sc.kind);
  double held = 0, peak = 0;
  for (const op& x : sc.ops[static_cast<std::size_t>(k)]) {
    const double bytes = chunks[static_cast<std::size_t>(x.chunk)].held_bytes;
    if (x.kind == op_kind::forward)
      peak = std::max(peak, held += bytes);
    else if (x.kind == op_kind::backward_weight ||
             (x.kind == op_kind::backward && !split))
      held -= bytes;
  }
  return peak;
}

} // namespace

std::string_view to_string(interval_kind k) noexcept {
  switch (k) {
    case interval_kind::forward:
      return "forward";
    case interval_kind::backward:
      return "backward";
    case interval_kind::backward_input:
      return "backward_input";
    case interval_kind::backward_weight:
      return "backward_weight";
    case interval_kind::wait:
      return "wait";
    case interval_kind::allreduce:
      return "allreduce";
    case interval_kind::optimizer:
      return "optimizer";
  }
  return "unknown";
}

double phase_simulator::makespan(schedule_kind kind, int stages,
                                 int micro_batches, const double* forward,
                                 const double* backward, const double* input,
                                 const double* weight,
                                 const double* activation_link,
                                 const double* gradient_link) {
  if (kind == schedule_kind::zb_hetero) {
    // Its lists depend on the times: made anew for every evaluation.
    const auto n = static_cast<std::size_t>(stages);
    times_.forward.assign(forward, forward + n);
    times_.input.assign(input, input + n);
    times_.weight.assign(weight, weight + n);
    schedule_ = make_schedule(kind, pipeline_layout::one_per_chip(stages),
                              micro_batches, times_);
    have_schedule_ = false;
  } else if (!have_schedule_ || schedule_.kind != kind ||
             schedule_.chips() != stages ||
             schedule_.micro_batches != micro_batches) {
    schedule_ = make_schedule(kind, stages, micro_batches);
    have_schedule_ = true;
  }
  loop_state st{clock_, sent_forward_, sent_backward_, next_, blocked_, ready_};
  no_recorder rec;
  run_lists(schedule_,
            {forward, backward, input, weight, activation_link, gradient_link},
            st, rec);
  ++runs_;
  return *std::max_element(clock_.begin(), clock_.end());
}

namespace {

/// Runs one replica's lists; fills its chips' outcomes.
void simulate_pipeline(const simulated_pipeline& pipe, int replica,
                       simulation& out, bool record_timeline) {
  H2_ENFORCE(!pipe.stages.empty(), "replica ", replica, " has no stages");
  const auto layout =
    pipe.layout.chips == 0
      ? pipeline_layout::one_per_chip(static_cast<int>(pipe.stages.size()))
      : pipe.layout;
  H2_ENFORCE(layout.chunk_chip.size() == pipe.stages.size(), "replica ",
             replica, ": a layout of ", layout.chunks(), " chunks for ",
             pipe.stages.size(), " stages");
  std::vector<double> fwd, bwd, input, weight, alink, glink;
  for (const auto& s : pipe.stages) {
    fwd.push_back(s.forward_seconds);
    bwd.push_back(s.backward_seconds);
    input.push_back(s.input_seconds);
    weight.push_back(s.weight_seconds);
    alink.push_back(s.activation_link_seconds);
    glink.push_back(s.gradient_link_seconds);
  }
  const schedule sc = make_schedule(pipe.kind, layout, pipe.micro_batches,
                                    schedule_times{fwd, input, weight});
  const int p = layout.chips;
  auto& outcomes = out.replicas.emplace_back(static_cast<std::size_t>(p));
  std::vector<double> clock, sent_f, sent_b;
  std::vector<std::size_t> next;
  std::vector<char> blocked;
  std::vector<int> ready;
  loop_state st{clock, sent_f, sent_b, next, blocked, ready};
  interval_recorder rec{replica, record_timeline ? &out.timeline : nullptr,
                        &outcomes};
  run_lists(sc,
            {fwd.data(), bwd.data(), input.data(), weight.data(), alink.data(),
             glink.data()},
            st, rec);
  for (int k = 0; k < p; ++k) {
    auto& o = outcomes[static_cast<std::size_t>(k)];
    double static_bytes = 0, working = 0, optimizer_working = 0;
    double capacity = std::numeric_limits<double>::infinity();
    for (int c = 0; c < layout.chunks(); ++c) {
      if (layout.chunk_chip[static_cast<std::size_t>(c)] != k)
        continue;
      const auto& x = pipe.stages[static_cast<std::size_t>(c)];
      static_bytes += x.static_bytes;
      working = std::max(working, x.working_bytes);
      optimizer_working =
        std::max(optimizer_working, x.optimizer_working_bytes);
      capacity = std::min(capacity, x.capacity_bytes);
    }
    o.phase_end_seconds = clock[static_cast<std::size_t>(k)];
    o.reduced_seconds = o.phase_end_seconds;
    o.peak_in_flight = peak_in_flight(sc, k);
    o.peak_bytes =
      static_bytes + std::max(peak_held_bytes(sc, k, pipe.stages) + working,
                              optimizer_working);
    o.fits = o.peak_bytes <= capacity;
    out.fits = out.fits && o.fits;
  }
}

} // namespace

simulation simulate(const std::vector<simulated_pipeline>& replicas,
                    const std::vector<simulated_reduction>& reductions,
                    bool record_timeline) {
  H2_ENFORCE(!replicas.empty(), "no replicas to simulate");
  simulation out;
  std::size_t chips = 0;
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    simulate_pipeline(replicas[r], static_cast<int>(r), out, record_timeline);
    chips += out.replicas.back().size();
  }
  // All-reduces, group after group: a group starts when its last member is
  // ready and holds every member until it ends.
  for (const auto& red : reductions) {
    double start = 0;
    for (auto [r, s] : red.members) {
      H2_ENFORCE(r >= 0 && static_cast<std::size_t>(r) < out.replicas.size() &&
                   s >= 0 &&
                   static_cast<std::size_t>(s) <
                     out.replicas[static_cast<std::size_t>(r)].size(),
                 "reduction member (", r, ", ", s, ") out of range");
      start = std::max(
        start,
        out.replicas[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)]
          .reduced_seconds);
    }
    const double end = start + red.seconds;
    for (auto [r, s] : red.members) {
      auto& o =
        out.replicas[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)];
      if (record_timeline && red.seconds > 0)
        out.timeline.push_back(
          {r, s, interval_kind::allreduce, -1, -1, start, end});
      o.reduced_seconds = end;
      o.allreduce_seconds += red.seconds;
    }
  }
  double phase_end = 0;
  for (const auto& rep : out.replicas)
    for (const auto& o : rep) {
      phase_end = std::max(phase_end, o.reduced_seconds);
      out.allreduce_seconds =
        std::max(out.allreduce_seconds, o.allreduce_seconds);
    }
  // The global norm, then the updates: a chip updates its chunks one after
  // the other.
  double busy = 0;
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    const auto& pipe = replicas[r];
    std::vector<double> opt(out.replicas[r].size(), 0.0);
    for (std::size_t c = 0; c < pipe.stages.size(); ++c)
      opt[pipe.layout.chips == 0
            ? c
            : static_cast<std::size_t>(pipe.layout.chunk_chip[c])] +=
        pipe.stages[c].optimizer_seconds;
    for (std::size_t s = 0; s < out.replicas[r].size(); ++s) {
      auto& o = out.replicas[r][s];
      o.optimizer_seconds = opt[s];
      o.end_seconds = phase_end + opt[s];
      o.idle_seconds =
        std::max(0.0, phase_end - o.forward_seconds - o.backward_seconds);
      busy += o.forward_seconds + o.backward_seconds;
      out.optimizer_seconds = std::max(out.optimizer_seconds, opt[s]);
      out.step_seconds = std::max(out.step_seconds, o.end_seconds);
      if (record_timeline)
        out.timeline.push_back({static_cast<int>(r), static_cast<int>(s),
                                interval_kind::optimizer, -1, -1, phase_end,
                                phase_end + opt[s]});
    }
  }
  out.pipeline_seconds = phase_end;
  double capacity = phase_end * static_cast<double>(chips);
  out.bubble_fraction = capacity > 0 ? std::max(0.0, 1.0 - busy / capacity) : 0;
  return out;
}

} // namespace h2::scheduler
