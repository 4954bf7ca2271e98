// The schedule simulator against hand-computed timelines, an independent
// reference execution, GPipe's closed form, monotonicity, memory and the
// step's tail (all-reduce, norm barrier, optimizer).
#include "h2/scheduler/simulator.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/validate.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

namespace h2::scheduler {
namespace {

simulated_pipeline pipeline(schedule_kind kind, int m, std::vector<double> fwd,
                            std::vector<double> bwd,
                            std::vector<double> act_link = {},
                            std::vector<double> grad_link = {}) {
  simulated_pipeline p;
  p.kind = kind;
  p.micro_batches = m;
  for (std::size_t s = 0; s < fwd.size(); ++s) {
    simulated_stage st;
    st.forward_seconds = fwd[s];
    st.backward_seconds = bwd[s];
    if (s < act_link.size())
      st.activation_link_seconds = act_link[s];
    if (s < grad_link.size())
      st.gradient_link_seconds = grad_link[s];
    p.stages.push_back(st);
  }
  return p;
}

/// The compute intervals of one stage, in order, as (kind, mb, start, end).
std::vector<std::tuple<interval_kind, int, double, double>>
compute_of(const simulation& sim, int stage) {
  std::vector<std::tuple<interval_kind, int, double, double>> out;
  for (const auto& iv : sim.timeline)
    if (iv.stage == stage && (iv.kind == interval_kind::forward ||
                              iv.kind == interval_kind::backward))
      out.emplace_back(iv.kind, iv.micro_batch, iv.start_seconds,
                       iv.end_seconds);
  return out;
}

using iv = std::tuple<interval_kind, int, double, double>;
constexpr auto F = interval_kind::forward;
constexpr auto B = interval_kind::backward;

// Two stages, GPipe, two micro-batches, stage 1 twice as slow, links of
// 0.5 s (activations into stage 1) and 0.25 s (gradients into stage 0).
TEST(scheduler_simulator, gpipe_hand_computed_timeline) {
  auto p =
    pipeline(schedule_kind::gpipe, 2, {1, 2}, {2, 4}, {0, 0.5}, {0.25, 0});
  p.stages[0].optimizer_seconds = 0.1;
  p.stages[1].optimizer_seconds = 0.3;
  auto sim = simulate({p}, {}, true);
  // Stage 0: F0 [0,1], F1 [1,2]; gradients of mb 0 arrive 9.5 + 0.25.
  EXPECT_EQ(
    compute_of(sim, 0),
    (std::vector<iv>{
      {F, 0, 0, 1}, {F, 1, 1, 2}, {B, 0, 9.75, 11.75}, {B, 1, 13.75, 15.75}}));
  // Stage 1: mb 0 arrives at 1.5, mb 1 at 2.5 (but F0 ends at 3.5).
  EXPECT_EQ(compute_of(sim, 1), (std::vector<iv>{{F, 0, 1.5, 3.5},
                                                 {F, 1, 3.5, 5.5},
                                                 {B, 0, 5.5, 9.5},
                                                 {B, 1, 9.5, 13.5}}));
  EXPECT_DOUBLE_EQ(sim.pipeline_seconds, 15.75);
  EXPECT_DOUBLE_EQ(sim.step_seconds, 15.75 + 0.3);
  EXPECT_DOUBLE_EQ(sim.replicas[0][0].idle_seconds, 15.75 - 6);
  EXPECT_DOUBLE_EQ(sim.replicas[0][1].idle_seconds, 15.75 - 12);
  EXPECT_DOUBLE_EQ(sim.replicas[0][0].wait_seconds,
                   (9.75 - 2) + (13.75 - 11.75));
  EXPECT_DOUBLE_EQ(sim.bubble_fraction, 1 - 18 / (2 * 15.75));
  // Both chips update after the slower one's last backward.
  EXPECT_DOUBLE_EQ(sim.replicas[0][0].end_seconds, 15.85);
  EXPECT_DOUBLE_EQ(sim.replicas[0][1].end_seconds, 16.05);
}

// Two stages, 1F1B, three micro-batches, links of 0.5 s both ways.
TEST(scheduler_simulator, one_f_one_b_hand_computed_timeline) {
  auto p =
    pipeline(schedule_kind::one_f_one_b, 3, {1, 1}, {2, 2}, {0, 0.5}, {0.5, 0});
  auto sim = simulate({p}, {}, true);
  // Stage 0 warms up with one forward, then alternates.
  EXPECT_EQ(compute_of(sim, 0), (std::vector<iv>{{F, 0, 0, 1},
                                                 {F, 1, 1, 2},
                                                 {B, 0, 5, 7},
                                                 {F, 2, 7, 8},
                                                 {B, 1, 8, 10},
                                                 {B, 2, 12, 14}}));
  EXPECT_EQ(compute_of(sim, 1), (std::vector<iv>{{F, 0, 1.5, 2.5},
                                                 {B, 0, 2.5, 4.5},
                                                 {F, 1, 4.5, 5.5},
                                                 {B, 1, 5.5, 7.5},
                                                 {F, 2, 8.5, 9.5},
                                                 {B, 2, 9.5, 11.5}}));
  EXPECT_DOUBLE_EQ(sim.pipeline_seconds, 14);
  EXPECT_DOUBLE_EQ(sim.step_seconds, 14);
}

// Three heterogeneous stages, 1F1B, four micro-batches, no links: the slow
// middle stage paces the steady state.
TEST(scheduler_simulator, one_f_one_b_slow_middle_stage) {
  auto p = pipeline(schedule_kind::one_f_one_b, 4, {1, 2, 1}, {1, 2, 1});
  auto sim = simulate({p}, {}, true);
  // Stage 1 runs back to back once its first input arrives at 1: every
  // other stage waits on it; stage 0 ends with the last backward that
  // stage 1 releases at 1 + 4 x (2 + 2) = 17.
  EXPECT_EQ(compute_of(sim, 1), (std::vector<iv>{{F, 0, 1, 3},
                                                 {F, 1, 3, 5},
                                                 {B, 0, 5, 7},
                                                 {F, 2, 7, 9},
                                                 {B, 1, 9, 11},
                                                 {F, 3, 11, 13},
                                                 {B, 2, 13, 15},
                                                 {B, 3, 15, 17}}));
  EXPECT_EQ(compute_of(sim, 0), (std::vector<iv>{{F, 0, 0, 1},
                                                 {F, 1, 1, 2},
                                                 {F, 2, 2, 3},
                                                 {B, 0, 7, 8},
                                                 {F, 3, 8, 9},
                                                 {B, 1, 11, 12},
                                                 {B, 2, 15, 16},
                                                 {B, 3, 17, 18}}));
  EXPECT_DOUBLE_EQ(sim.pipeline_seconds, 18);
  EXPECT_DOUBLE_EQ(sim.replicas[0][1].idle_seconds, 18 - 16);
}

/// An independent execution: sweeps over the stages until nothing moves,
/// each op started when its inputs exist (the definition, not the event
/// loop).
double reference_makespan(const simulated_pipeline& p) {
  auto sc =
    make_schedule(p.kind, static_cast<int>(p.stages.size()), p.micro_batches);
  const auto P = p.stages.size();
  std::vector<std::size_t> next(P, 0);
  std::vector<double> clock(P, 0);
  std::map<std::pair<std::size_t, int>, double> sent_f, sent_b;
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < P; ++s)
      for (; next[s] < sc.ops[s].size(); ++next[s], progress = true) {
        const auto& x = sc.ops[s][next[s]];
        const auto& c = p.stages[s];
        if (x.kind == op_kind::recv_forward) {
          auto it = sent_f.find({s - 1, x.micro_batch});
          if (it == sent_f.end())
            break;
          clock[s] = std::max(clock[s], it->second + c.activation_link_seconds);
        } else if (x.kind == op_kind::recv_backward) {
          auto it = sent_b.find({s + 1, x.micro_batch});
          if (it == sent_b.end())
            break;
          clock[s] = std::max(clock[s], it->second + c.gradient_link_seconds);
        } else if (x.kind == op_kind::forward) {
          clock[s] += c.forward_seconds;
        } else if (x.kind == op_kind::backward) {
          clock[s] += c.backward_seconds;
        } else if (x.kind == op_kind::backward_input) {
          clock[s] += c.input_seconds;
        } else if (x.kind == op_kind::backward_weight) {
          clock[s] += c.weight_seconds;
        } else if (x.kind == op_kind::send_forward) {
          sent_f[{s, x.micro_batch}] = clock[s];
        } else {
          sent_b[{s, x.micro_batch}] = clock[s];
        }
      }
  }
  return *std::max_element(clock.begin(), clock.end());
}

simulated_pipeline random_pipeline(std::mt19937_64& g, schedule_kind kind) {
  std::uniform_int_distribution<int> stages(1, 7), mbs(1, 12);
  std::uniform_real_distribution<double> t(0.1, 3), link(0, 1);
  const int p = stages(g);
  simulated_pipeline out;
  out.kind = kind;
  out.micro_batches = mbs(g);
  for (int s = 0; s < p; ++s) {
    simulated_stage st;
    st.forward_seconds = t(g);
    st.backward_seconds = t(g) * 2;
    st.input_seconds = st.backward_seconds * 0.7;
    st.weight_seconds = st.backward_seconds * 0.5;
    st.activation_link_seconds = s > 0 ? link(g) : 0;
    st.gradient_link_seconds = s + 1 < p ? link(g) : 0;
    out.stages.push_back(st);
  }
  return out;
}

TEST(scheduler_simulator, equals_reference_execution) {
  std::mt19937_64 g(5);
  phase_simulator fast;
  const schedule_kind kinds[] = {
    schedule_kind::gpipe, schedule_kind::one_f_one_b, schedule_kind::zb_h1};
  for (int i = 0; i < 600; ++i) {
    auto kind = kinds[i % 3];
    auto p = random_pipeline(g, kind);
    const double ref = reference_makespan(p);
    EXPECT_DOUBLE_EQ(simulate({p}).pipeline_seconds, ref);
    std::vector<double> f, b, in, w, a, gl;
    for (const auto& s : p.stages) {
      f.push_back(s.forward_seconds);
      b.push_back(s.backward_seconds);
      in.push_back(s.input_seconds);
      w.push_back(s.weight_seconds);
      a.push_back(s.activation_link_seconds);
      gl.push_back(s.gradient_link_seconds);
    }
    EXPECT_DOUBLE_EQ(fast.makespan(kind, static_cast<int>(p.stages.size()),
                                   p.micro_batches, f.data(), b.data(),
                                   in.data(), w.data(), a.data(), gl.data()),
                     ref);
  }
}

// The textbook bubbles on identical chips with free links (schedule.hpp,
// theoretical_bubble): 1F1B, interleaved 1F1B with v chunks per chip (each
// chunk a v-th of a stage), ZB-H1 with F = B = W.
TEST(scheduler_simulator, bubbles_match_theory) {
  for (int p : {2, 4, 8})
    for (int m : {p, 2 * p, 4 * p}) {
      SCOPED_TRACE(testing::Message() << p << "x" << m);
      simulated_pipeline one;
      one.kind = schedule_kind::one_f_one_b;
      one.micro_batches = m;
      one.stages.assign(static_cast<std::size_t>(p), {});
      for (auto& s : one.stages) {
        s.forward_seconds = 1;
        s.backward_seconds = 2;
        s.input_seconds = 1;
        s.weight_seconds = 1;
      }
      EXPECT_NEAR(simulate({one}).bubble_fraction,
                  theoretical_bubble(schedule_kind::one_f_one_b, p, m), 1e-9);
      auto zb = one;
      zb.kind = schedule_kind::zb_h1;
      EXPECT_NEAR(simulate({zb}).bubble_fraction,
                  theoretical_bubble(schedule_kind::zb_h1, p, m), 1e-9);
      for (int v : {2, 3}) {
        simulated_pipeline il;
        il.kind = schedule_kind::interleaved_1f1b;
        il.micro_batches = m;
        il.layout = pipeline_layout::dealt(
          std::vector<int>(static_cast<std::size_t>(p), v));
        il.stages.assign(static_cast<std::size_t>(p * v), {});
        for (auto& s : il.stages) {
          s.forward_seconds = 1.0 / v;
          s.backward_seconds = 2.0 / v;
        }
        auto sim = simulate({il});
        ASSERT_EQ(sim.replicas[0].size(), static_cast<std::size_t>(p));
        EXPECT_NEAR(
          sim.bubble_fraction,
          theoretical_bubble(schedule_kind::interleaved_1f1b, p, m, v), 1e-9);
      }
    }
}

// Several chunks per chip: a chip's memory adds up its chunks, its update
// is the sum of theirs, and the timeline names the chunk of every op.
TEST(scheduler_simulator, chunks_share_their_chip) {
  simulated_pipeline il;
  il.kind = schedule_kind::interleaved_1f1b;
  il.micro_batches = 2;
  il.layout = pipeline_layout::dealt({2, 2});
  for (int c = 0; c < 4; ++c) {
    simulated_stage s;
    s.forward_seconds = 1;
    s.backward_seconds = 2;
    s.optimizer_seconds = 0.5;
    s.static_bytes = 100;
    s.held_bytes = 10 * (c + 1);
    il.stages.push_back(s);
  }
  auto sim = simulate({il}, {}, true);
  ASSERT_EQ(sim.replicas[0].size(), 2u);
  const auto& chip0 = sim.replicas[0][0];
  EXPECT_DOUBLE_EQ(chip0.optimizer_seconds, 1.0);
  EXPECT_DOUBLE_EQ(chip0.forward_seconds, 4.0); // 2 chunks x 2 mbs
  EXPECT_DOUBLE_EQ(chip0.backward_seconds, 8.0);
  // Chip 0 holds chunks 0 and 2 (10 and 30 bytes per micro-batch); its
  // warm-up of 4 forwards holds everything at once.
  EXPECT_EQ(chip0.peak_in_flight, 4);
  EXPECT_DOUBLE_EQ(chip0.peak_bytes, 200 + 2 * 10 + 2 * 30);
  bool chunk2 = false;
  for (const auto& iv : sim.timeline)
    chunk2 = chunk2 || (iv.stage == 0 && iv.chunk == 2 &&
                        iv.kind == interval_kind::forward);
  EXPECT_TRUE(chunk2);
}

// zb-hetero keeps the best of its W placements under the chips' own
// times: on random mixed pipelines (links free) it is never slower than
// zb-h1 and often faster.
TEST(scheduler_simulator, zb_hetero_is_never_slower_than_zb_h1) {
  std::mt19937_64 g(9);
  std::uniform_real_distribution<double> t(0.3, 3);
  int better = 0, worse = 0;
  double best_gain = 0;
  for (int i = 0; i < 2000; ++i) {
    simulated_pipeline q;
    q.micro_batches = 4 + i % 9;
    const int p = 2 + i % 5;
    for (int s = 0; s < p; ++s) {
      simulated_stage st;
      const double speed = t(g);
      st.forward_seconds = speed * t(g);
      st.input_seconds = speed * t(g);
      st.weight_seconds = speed * t(g);
      st.backward_seconds = st.input_seconds + st.weight_seconds;
      q.stages.push_back(st);
    }
    q.kind = schedule_kind::zb_h1;
    const double h1 = simulate({q}).pipeline_seconds;
    q.kind = schedule_kind::zb_hetero;
    const double hetero = simulate({q}).pipeline_seconds;
    better += hetero < h1 * (1 - 1e-9);
    worse += hetero > h1 * (1 + 1e-9);
    best_gain = std::max(best_gain, 1 - hetero / h1);
  }
  EXPECT_EQ(worse, 0);
  EXPECT_GT(better, 100);
  EXPECT_GT(best_gain, 0.05);
  std::printf("[ info ] 2000 random mixed pipelines: zb-hetero faster than "
              "zb-h1 in %d, by up to %.1f%%\n",
              better, 100 * best_gain);
}

// ZB-H1's timeline has B and W where 1F1B has one backward.
TEST(scheduler_simulator, zb_h1_timeline_has_b_and_w) {
  auto p = pipeline(schedule_kind::zb_h1, 3, {1, 1}, {2, 2});
  for (auto& s : p.stages) {
    s.input_seconds = 1;
    s.weight_seconds = 1;
  }
  auto sim = simulate({p}, {}, true);
  int inputs = 0, weights = 0, fused = 0;
  for (const auto& iv : sim.timeline) {
    inputs += iv.kind == interval_kind::backward_input;
    weights += iv.kind == interval_kind::backward_weight;
    fused += iv.kind == interval_kind::backward;
  }
  EXPECT_EQ(inputs, 6);
  EXPECT_EQ(weights, 6);
  EXPECT_EQ(fused, 0);
  EXPECT_DOUBLE_EQ(sim.pipeline_seconds, 3 * 3 + 1); // 3m + p - 1
}

// GPipe is a flow shop of identical jobs per phase: sum of stage times
// plus links plus (m - 1) times the slowest stage, forward and backward.
TEST(scheduler_simulator, gpipe_has_a_closed_form) {
  std::mt19937_64 g(6);
  for (int i = 0; i < 300; ++i) {
    auto p = random_pipeline(g, schedule_kind::gpipe);
    double sum = 0, max_f = 0, max_b = 0;
    for (std::size_t s = 0; s < p.stages.size(); ++s) {
      const auto& st = p.stages[s];
      sum += st.forward_seconds + st.backward_seconds;
      max_f = std::max(max_f, st.forward_seconds);
      max_b = std::max(max_b, st.backward_seconds);
      if (s > 0)
        sum += st.activation_link_seconds;
      if (s + 1 < p.stages.size())
        sum += st.gradient_link_seconds;
    }
    double closed = sum + (p.micro_batches - 1) * (max_f + max_b);
    EXPECT_NEAR(simulate({p}).pipeline_seconds, closed, 1e-9 * closed);
  }
}

// 1F1B has no such closed form: the bottleneck's (m - 1)(F + B) formula is
// neither an upper nor a lower bound in general.
TEST(scheduler_simulator, one_f_one_b_is_not_the_bottleneck_formula) {
  // Stage 0 is the bottleneck and its backward hides stage 1 completely.
  auto p = pipeline(schedule_kind::one_f_one_b, 4, {3, 1}, {6, 1});
  double formula = (3 + 6 + 1 + 1) + 3 * (3 + 6);
  EXPECT_DOUBLE_EQ(simulate({p}).pipeline_seconds, 4 * (3 + 6));
  EXPECT_LT(simulate({p}).pipeline_seconds, formula);
}

// No op getting longer ever makes the step shorter: what makes
// "recompute only where it does not fit otherwise" optimal.
TEST(scheduler_simulator, makespan_is_monotone_in_every_duration) {
  std::mt19937_64 g(7);
  std::uniform_real_distribution<double> more(0, 1.5);
  for (int i = 0; i < 300; ++i) {
    auto kind = i % 2 ? schedule_kind::gpipe : schedule_kind::one_f_one_b;
    auto p = random_pipeline(g, kind);
    const double base = simulate({p}).pipeline_seconds;
    auto q = p;
    auto s = static_cast<std::size_t>(i) % q.stages.size();
    switch (i % 4) {
      case 0:
        q.stages[s].forward_seconds += more(g);
        break;
      case 1:
        q.stages[s].backward_seconds += more(g);
        break;
      case 2:
        q.stages[s].activation_link_seconds += more(g);
        break;
      default:
        q.stages[s].gradient_link_seconds += more(g);
    }
    EXPECT_GE(simulate({q}).pipeline_seconds, base);
  }
}

TEST(scheduler_simulator, memory_follows_the_in_flight_bound) {
  for (auto kind : {schedule_kind::gpipe, schedule_kind::one_f_one_b}) {
    auto p = pipeline(kind, 6, {1, 1, 1, 1}, {2, 2, 2, 2});
    for (auto& s : p.stages) {
      s.static_bytes = 100;
      s.held_bytes = 10;
      s.working_bytes = 5;
      s.optimizer_working_bytes = 30;
      s.capacity_bytes = 150;
    }
    auto sim = simulate({p});
    for (int s = 0; s < 4; ++s) {
      const auto& o = sim.replicas[0][static_cast<std::size_t>(s)];
      int n = in_flight_bound(kind, 4, s, 6);
      EXPECT_EQ(o.peak_in_flight, n);
      EXPECT_DOUBLE_EQ(o.peak_bytes, 100 + std::max(10.0 * n + 5, 30.0));
      EXPECT_EQ(o.fits, o.peak_bytes <= 150);
    }
    // GPipe holds all six micro-batches everywhere: 165 > 150.
    EXPECT_EQ(sim.fits, kind == schedule_kind::one_f_one_b);
  }
}

// Replicas: a chip all-reduces its gradients with the other replicas'
// holders of its layers after its last backward, group after group in
// layer order, each group starting when its last member is ready; then the
// global norm (a barrier), then the updates.
TEST(scheduler_simulator, replicas_all_reduce_then_update) {
  // Replica a: two stages, GPipe, 2 micro-batches (stage 1 ends at 5,
  // stage 0 at 6). Replica b: one stage, 1 micro-batch (ends at 4).
  auto a = pipeline(schedule_kind::gpipe, 2, {1, 1}, {1, 1});
  auto b = pipeline(schedule_kind::gpipe, 1, {2}, {2});
  a.stages[0].optimizer_seconds = 0.2;
  b.stages[0].optimizer_seconds = 0.1;
  // a's stage 0 and b share the first layers, a's stage 1 and b the rest.
  std::vector<simulated_reduction> reductions{{{{0, 0}, {1, 0}}, 0.5},
                                              {{{0, 1}, {1, 0}}, 0.75}};
  auto sim = simulate({a, b}, reductions, true);
  // Group 1 starts at max(6, 4) = 6, ends 6.5; group 2 waits for b's
  // chip: max(5, 6.5) = 6.5, ends 7.25.
  EXPECT_DOUBLE_EQ(sim.replicas[0][0].phase_end_seconds, 6);
  EXPECT_DOUBLE_EQ(sim.replicas[0][1].phase_end_seconds, 5);
  EXPECT_DOUBLE_EQ(sim.replicas[0][0].reduced_seconds, 6.5);
  EXPECT_DOUBLE_EQ(sim.replicas[0][1].reduced_seconds, 7.25);
  EXPECT_DOUBLE_EQ(sim.replicas[1][0].reduced_seconds, 7.25);
  EXPECT_DOUBLE_EQ(sim.replicas[1][0].allreduce_seconds, 1.25);
  EXPECT_DOUBLE_EQ(sim.allreduce_seconds, 1.25);
  EXPECT_DOUBLE_EQ(sim.pipeline_seconds, 7.25);
  EXPECT_DOUBLE_EQ(sim.step_seconds, 7.25 + 0.2);
  EXPECT_DOUBLE_EQ(sim.replicas[1][0].end_seconds, 7.25 + 0.1);
  // Idle counts to the end of the phase, all-reduces included (as the
  // runtime reports it).
  EXPECT_DOUBLE_EQ(sim.replicas[1][0].idle_seconds, 7.25 - 4);
  int allreduces = 0;
  for (const auto& i : sim.timeline)
    allreduces += i.kind == interval_kind::allreduce ? 1 : 0;
  EXPECT_EQ(allreduces, 4);
  EXPECT_THROW(simulate({a, b}, {{{{2, 0}}, 1.0}}), internal_error);
}

TEST(scheduler_simulator, one_stage_and_one_micro_batch) {
  auto p = pipeline(schedule_kind::one_f_one_b, 1, {1.5}, {2.5});
  p.stages[0].optimizer_seconds = 1;
  auto sim = simulate({p});
  EXPECT_DOUBLE_EQ(sim.step_seconds, 5);
  EXPECT_DOUBLE_EQ(sim.bubble_fraction, 0);
  EXPECT_THROW(simulate({}), internal_error);
}

} // namespace
} // namespace h2::scheduler
