// Live rebalancing (issue 12, docs/rebalance.md):
// - pause: the wall time training stands still for a live re-plan, against
//   the time the same bytes take over a raw shm channel (DiComm, two
//   threads of this process), for three model widths;
// - demo: the demo job on the wall clock, its H100 throttled 2x mid-run,
//   with the policy on and off: tokens/s before and after the throttle
//   (`--svg FILE` also draws tokens/s per step of both runs).
#include "bench_common.hpp"
#include "channel_pair.hpp"
#include "test_jobs.hpp" // one_replica_plan

#include "h2/actors/local_job.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

namespace h2::bench {
namespace {

/// The demo's four chips under a GPT of width `d_model`, 8 blocks,
/// virtual clock.
std::shared_ptr<job_config> pause_job(int d_model, int steps) {
  std::ostringstream toml;
  toml << R"([job]
seed = 3
[model]
vocab_size = 65
seq_len = 32
d_model = )"
       << d_model << R"(
n_head = 4
n_layer = 8
[data]
source = "markov"
entropy_rate = 1.0
[train]
global_batch = 8
micro_batch = 2
steps = )"
       << steps << R"(
[emulation]
clock = "virtual"
memory_scale = 0.01
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x",
         "emulated:a100-sxm-40gb", "emulated:a100-sxm-40gb"]
)";
  return std::make_shared<job_config>(parse_job(toml.str(), "pause.toml"));
}

plan cut(const job_config& job, const std::vector<int>& layers) {
  return test::one_replica_plan(job, layers, job.train.micro_batch,
                                job.train.global_batch / job.train.micro_batch);
}

/// The pauses of `moves` re-plans alternating between `a` and `b`, and the
/// most bytes one moved.
std::pair<std::vector<double>, double>
replan_pauses(const std::shared_ptr<job_config>& job, const plan& a,
              const plan& b, int moves) {
  actors::run_options o(job->train.steps);
  for (int i = 0; i < moves; ++i)
    o.replans[2 * i + 2] = i % 2 == 0 ? b : a;
  actors::local_job local(job, a);
  runtime::step_recorder rec;
  local.run(o, rec);
  std::vector<double> pauses;
  double bytes = 0;
  for (const auto& e : rec.rebalances) {
    pauses.push_back(e.pause_seconds);
    bytes = std::max(bytes, e.moved_bytes);
  }
  return {pauses, bytes};
}

std::vector<record> pause_bench() {
  std::vector<record> out;
  for (int width : {64, 128, 256}) {
    constexpr int moves = 10;
    auto job = pause_job(width, 2 * moves + 2);
    const plan a = cut(*job, {3, 3, 2, 2}), b = cut(*job, {5, 2, 2, 1});
    const auto [pauses, bytes] = replan_pauses(job, a, b, moves);
    // The floor: re-plans that move no layer (the micro-batching changes),
    // so every chip still takes both plans and rebuilds its schedule.
    auto same_layers = a;
    same_layers.replicas.front().micro_batch_size *= 2;
    same_layers.replicas.front().micro_batches /= 2;
    const auto floor = replan_pauses(job, a, same_layers, moves).first;
    // The same bytes over a raw shm channel (one message, as one move).
    channel_pair shm("shm", false);
    const double raw =
      bytes / channel_throughput(shm, static_cast<std::uint64_t>(bytes), 8);
    const double pause = quantile(pauses, 0.5);
    std::ostringstream note;
    note << "median of " << pauses.size() << " re-plans moving up to "
         << bytes / (1 << 20) << " MiB; baseline: the same bytes over a raw "
         << "shm channel";
    out.push_back({"rebalance.pause_seconds_d" + std::to_string(width), pause,
                   "s", raw, pause / raw, note.str()});
    const double fixed = quantile(floor, 0.5);
    out.push_back({"rebalance.floor_seconds_d" + std::to_string(width), fixed,
                   "s", raw, fixed / raw,
                   "median pause of re-plans that move no layer (the "
                   "micro-batching changes); baseline: the moving re-plans' "
                   "bytes over raw shm"});
  }
  return out;
}

struct demo_run {
  std::vector<double> tokens_per_second; ///< per step
  std::vector<runtime::rebalance_event> rebalances;
};

demo_run run_demo(bool policy, int steps, int throttle_step) {
  auto job =
    std::make_shared<job_config>(parse_job(demo_job_toml(), "demo.toml"));
  job->metrics.port = 0;
  job->train.steps = steps;
  job->rebalance.policy =
    policy ? rebalance_mode::automatic : rebalance_mode::off;
  job->drills = {drill{throttle_step, chip_id{0, 0}, 2}};
  actors::local_job local(job, scheduler::make_plan(*job));
  runtime::step_recorder rec;
  local.run(actors::run_options(steps), rec);
  demo_run out;
  for (const auto& s : rec.steps)
    out.tokens_per_second.push_back(s.tokens_per_second);
  out.rebalances = rec.rebalances;
  return out;
}

double mean(const std::vector<double>& xs, int from, int to) {
  double sum = 0;
  for (int i = from; i < to; ++i)
    sum += xs.at(static_cast<std::size_t>(i));
  return sum / (to - from);
}

/// Tokens/s per step of both runs, the throttle marked.
void write_svg(const std::string& path, const demo_run& on, const demo_run& off,
               int throttle_step) {
  const double w = 720, h = 360, left = 60, right = 20, top = 30, bottom = 50;
  double hi = 0;
  for (double v : on.tokens_per_second)
    hi = std::max(hi, v);
  for (double v : off.tokens_per_second)
    hi = std::max(hi, v);
  hi = std::ceil(hi / 500) * 500;
  const auto n = on.tokens_per_second.size();
  auto x = [&](double step) {
    return left + (w - left - right) * step / static_cast<double>(n);
  };
  auto y = [&](double v) {
    return top + (h - top - bottom) * (1 - v / hi);
  };
  std::ofstream svg(path);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w
      << "\" height=\"" << h << "\" font-family=\"sans-serif\" "
      << "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" "
      << "fill=\"white\"/>\n";
  svg << "<text x=\"" << left << "\" y=\"18\">The demo, wall clock: tokens/s "
      << "per step; chip 0:0 (H100) throttled 2x before step "
      << throttle_step + 1 << "</text>\n";
  for (int i = 0; i <= 4; ++i) {
    const double v = hi * i / 4;
    svg << "<line x1=\"" << left << "\" x2=\"" << w - right << "\" y1=\""
        << y(v) << "\" y2=\"" << y(v) << "\" stroke=\"#ddd\"/>\n"
        << "<text x=\"" << left - 6 << "\" y=\"" << y(v) + 4
        << "\" text-anchor=\"end\">" << v << "</text>\n";
  }
  svg << "<line x1=\"" << x(throttle_step) << "\" x2=\"" << x(throttle_step)
      << "\" y1=\"" << top << "\" y2=\"" << h - bottom
      << "\" stroke=\"#888\" stroke-dasharray=\"4 4\"/>\n";
  auto line = [&](const demo_run& r, const char* colour) {
    svg << "<polyline fill=\"none\" stroke=\"" << colour
        << "\" stroke-width=\"1.5\" points=\"";
    for (std::size_t i = 0; i < r.tokens_per_second.size(); ++i)
      svg << x(static_cast<double>(i) + 0.5) << "," << y(r.tokens_per_second[i])
          << " ";
    svg << "\"/>\n";
  };
  line(off, "#d62728");
  line(on, "#1f77b4");
  svg << "<text x=\"" << (left + w - right) / 2 << "\" y=\"" << h - 12
      << "\" text-anchor=\"middle\">step</text>\n"
      << "<text x=\"" << w - right - 160 << "\" y=\"" << h - 12
      << "\" fill=\"#1f77b4\">policy auto</text>\n"
      << "<text x=\"" << w - right - 70 << "\" y=\"" << h - 12
      << "\" fill=\"#d62728\">policy off</text>\n</svg>\n";
}

std::vector<record> demo_bench(int steps, const std::string& svg) {
  const int throttle = steps / 2, settle = 10;
  const demo_run on = run_demo(true, steps, throttle);
  const demo_run off = run_demo(false, steps, throttle);
  const double on_before = mean(on.tokens_per_second, settle, throttle);
  const double off_before = mean(off.tokens_per_second, settle, throttle);
  const double on_after = mean(on.tokens_per_second, throttle + settle, steps);
  const double off_after =
    mean(off.tokens_per_second, throttle + settle, steps);
  std::string moves;
  for (const auto& e : on.rebalances)
    moves += (moves.empty() ? "" : "; ") + std::string("step ") +
             std::to_string(e.step + 1) + ": " + e.reason;
  if (!svg.empty())
    write_svg(svg, on, off, throttle);
  const std::string window = "steps " + std::to_string(settle + 1) + "-" +
                             std::to_string(throttle) + ", mean";
  const std::string after = "steps " + std::to_string(throttle + settle + 1) +
                            "-" + std::to_string(steps) + ", mean";
  return {
    {"demo.tokens_per_second_before_throttle_policy_auto_vs_off", on_before,
     "tok/s", off_before, on_before / off_before,
     window + "; rebalances: " + moves},
    {"demo.tokens_per_second_after_throttle_policy_auto_vs_off", on_after,
     "tok/s", off_after, on_after / off_after, after},
    {"demo.tokens_per_second_after_vs_before_throttle_policy_auto", on_after,
     "tok/s", on_before, on_after / on_before, "what the throttle cost"},
    {"demo.tokens_per_second_after_vs_before_throttle_policy_off", off_after,
     "tok/s", off_before, off_after / off_before, "what the throttle cost"},
  };
}

} // namespace
} // namespace h2::bench

int main(int argc, char** argv) {
  using namespace h2;
  const std::string only = bench::flag_value(argc, argv, "--only");
  const std::string steps = bench::flag_value(argc, argv, "--steps");
  std::vector<bench::record> rs;
  if (only.empty() || only == "pause")
    for (auto& r : bench::pause_bench())
      rs.push_back(std::move(r));
  if (only.empty() || only == "demo")
    for (auto& r : bench::demo_bench(steps.empty() ? 80 : std::stoi(steps),
                                     bench::flag_value(argc, argv, "--svg")))
      rs.push_back(std::move(r));
  for (const auto& r : rs)
    bench::print(r);
  if (auto out = bench::out_path(argc, argv); !out.empty())
    bench::append_results(out, rs);
  return 0;
}
