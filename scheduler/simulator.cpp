#include "h2/scheduler/simulator.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/validate.hpp"

#include <algorithm>

namespace h2::scheduler {

namespace {

/// What the event loop reports per op (nothing, for the planner's fast
/// path).
struct no_recorder {
  void compute(int, interval_kind, int, double, double) {}
  void wait(int, int, double, double) {}
};

struct interval_recorder {
  int replica;
  std::vector<timeline_interval>* out;
  std::vector<stage_outcome>* stages;

  void compute(int s, interval_kind k, int mb, double start, double end) {
    auto& o = (*stages)[static_cast<std::size_t>(s)];
    (k == interval_kind::forward ? o.forward_seconds : o.backward_seconds) +=
      end - start;
    if (out != nullptr)
      out->push_back({replica, s, k, mb, start, end});
  }
  void wait(int s, int mb, double start, double end) {
    (*stages)[static_cast<std::size_t>(s)].wait_seconds += end - start;
    if (out != nullptr && end > start)
      out->push_back({replica, s, interval_kind::wait, mb, start, end});
  }
};

/// Buffers of one run of the event loop.
struct loop_state {
  std::vector<double>& clock;
  std::vector<double>& sent_forward;  ///< [stage * m + mb], -1: not yet
  std::vector<double>& sent_backward; ///< [stage * m + mb], -1: not yet
  std::vector<std::size_t>& next;
  std::vector<char>& blocked;
  std::vector<int>& ready;
};

/// Runs every stage's op list; a stage blocked on a receive resumes when
/// its neighbour sends. Returns each stage's clock at its list's end in
/// state.clock.
template <class Recorder>
void run_lists(const schedule& sc, const double* forward,
               const double* backward, const double* activation_link,
               const double* gradient_link, loop_state& st, Recorder& rec) {
  const auto p = static_cast<std::size_t>(sc.stages);
  const auto m = static_cast<std::size_t>(sc.micro_batches);
  st.clock.assign(p, 0.0);
  st.sent_forward.assign(p * m, -1.0);
  st.sent_backward.assign(p * m, -1.0);
  st.next.assign(p, 0);
  st.blocked.assign(p, 0);
  st.ready.clear();
  for (std::size_t s = p; s-- > 0;)
    st.ready.push_back(static_cast<int>(s));
  std::size_t finished = 0;
  while (!st.ready.empty()) {
    const auto s = static_cast<std::size_t>(st.ready.back());
    st.ready.pop_back();
    const auto& list = sc.ops[s];
    double clock = st.clock[s];
    std::size_t j = st.next[s];
    for (; j < list.size(); ++j) {
      const op& x = list[j];
      const auto mb = static_cast<std::size_t>(x.micro_batch);
      bool stop = false;
      switch (x.kind) {
        case op_kind::recv_forward: {
          double sent = st.sent_forward[(s - 1) * m + mb];
          if (sent < 0) {
            stop = true;
            break;
          }
          double arrival = sent + activation_link[s];
          if (arrival > clock) {
            rec.wait(static_cast<int>(s), x.micro_batch, clock, arrival);
            clock = arrival;
          }
          break;
        }
        case op_kind::recv_backward: {
          double sent = st.sent_backward[(s + 1) * m + mb];
          if (sent < 0) {
            stop = true;
            break;
          }
          double arrival = sent + gradient_link[s];
          if (arrival > clock) {
            rec.wait(static_cast<int>(s), x.micro_batch, clock, arrival);
            clock = arrival;
          }
          break;
        }
        case op_kind::forward: {
          double end = clock + forward[s];
          rec.compute(static_cast<int>(s), interval_kind::forward,
                      x.micro_batch, clock, end);
          clock = end;
          break;
        }
        case op_kind::backward: {
          double end = clock + backward[s];
          rec.compute(static_cast<int>(s), interval_kind::backward,
                      x.micro_batch, clock, end);
          clock = end;
          break;
        }
        case op_kind::send_forward:
          st.sent_forward[s * m + mb] = clock;
          if (st.blocked[s + 1]) {
            st.blocked[s + 1] = 0;
            st.ready.push_back(static_cast<int>(s + 1));
          }
          break;
        case op_kind::send_backward:
          st.sent_backward[s * m + mb] = clock;
          if (st.blocked[s - 1]) {
            st.blocked[s - 1] = 0;
            st.ready.push_back(static_cast<int>(s - 1));
          }
          break;
      }
      if (stop)
        break;
    }
    st.clock[s] = clock;
    st.next[s] = j;
    if (j < list.size())
      st.blocked[s] = 1;
    else
      ++finished;
  }
  H2_ENFORCE(finished == p, "the op lists deadlock (", p - finished,
             " stages never finish)");
}

} // namespace

std::string_view to_string(interval_kind k) noexcept {
  switch (k) {
    case interval_kind::forward:
      return "forward";
    case interval_kind::backward:
      return "backward";
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
                                 const double* backward,
                                 const double* activation_link,
                                 const double* gradient_link) {
  if (!have_schedule_ || schedule_.kind != kind || schedule_.stages != stages ||
      schedule_.micro_batches != micro_batches) {
    schedule_ = make_schedule(kind, stages, micro_batches);
    have_schedule_ = true;
  }
  loop_state st{clock_, sent_forward_, sent_backward_, next_, blocked_, ready_};
  no_recorder rec;
  run_lists(schedule_, forward, backward, activation_link, gradient_link, st,
            rec);
  ++runs_;
  return *std::max_element(clock_.begin(), clock_.end());
}

simulation simulate(const std::vector<simulated_pipeline>& replicas,
                    const std::vector<simulated_reduction>& reductions,
                    bool record_timeline) {
  H2_ENFORCE(!replicas.empty(), "no replicas to simulate");
  simulation out;
  std::vector<double> clock, sent_f, sent_b;
  std::vector<std::size_t> next;
  std::vector<char> blocked;
  std::vector<int> ready;
  std::vector<double> fwd, bwd, alink, glink;
  std::size_t chips = 0;
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    const auto& pipe = replicas[r];
    const int p = static_cast<int>(pipe.stages.size());
    H2_ENFORCE(p >= 1, "replica ", r, " has no stages");
    schedule sc = make_schedule(pipe.kind, p, pipe.micro_batches);
    fwd.clear();
    bwd.clear();
    alink.clear();
    glink.clear();
    for (const auto& s : pipe.stages) {
      fwd.push_back(s.forward_seconds);
      bwd.push_back(s.backward_seconds);
      alink.push_back(s.activation_link_seconds);
      glink.push_back(s.gradient_link_seconds);
    }
    auto& outcomes = out.replicas.emplace_back(static_cast<std::size_t>(p));
    loop_state st{clock, sent_f, sent_b, next, blocked, ready};
    interval_recorder rec{static_cast<int>(r),
                          record_timeline ? &out.timeline : nullptr, &outcomes};
    run_lists(sc, fwd.data(), bwd.data(), alink.data(), glink.data(), st, rec);
    for (int s = 0; s < p; ++s) {
      auto& o = outcomes[static_cast<std::size_t>(s)];
      const auto& c = pipe.stages[static_cast<std::size_t>(s)];
      o.phase_end_seconds = clock[static_cast<std::size_t>(s)];
      o.reduced_seconds = o.phase_end_seconds;
      o.peak_in_flight = peak_in_flight(sc, s);
      o.peak_bytes = c.static_bytes +
                     std::max(c.held_bytes * o.peak_in_flight + c.working_bytes,
                              c.optimizer_working_bytes);
      o.fits = o.peak_bytes <= c.capacity_bytes;
      out.fits = out.fits && o.fits;
    }
    chips += static_cast<std::size_t>(p);
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
          {r, s, interval_kind::allreduce, -1, start, end});
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
  // The global norm, then the updates.
  double busy = 0;
  for (std::size_t r = 0; r < replicas.size(); ++r)
    for (std::size_t s = 0; s < replicas[r].stages.size(); ++s) {
      auto& o = out.replicas[r][s];
      double opt = replicas[r].stages[s].optimizer_seconds;
      o.optimizer_seconds = opt;
      o.end_seconds = phase_end + opt;
      o.idle_seconds =
        std::max(0.0, phase_end - o.forward_seconds - o.backward_seconds);
      busy += o.forward_seconds + o.backward_seconds;
      out.optimizer_seconds = std::max(out.optimizer_seconds, opt);
      out.step_seconds = std::max(out.step_seconds, o.end_seconds);
      if (record_timeline)
        out.timeline.push_back({static_cast<int>(r), static_cast<int>(s),
                                interval_kind::optimizer, -1, phase_end,
                                phase_end + opt});
    }
  out.pipeline_seconds = phase_end;
  double capacity = phase_end * static_cast<double>(chips);
  out.bubble_fraction = capacity > 0 ? std::max(0.0, 1.0 - busy / capacity) : 0;
  return out;
}

} // namespace h2::scheduler
