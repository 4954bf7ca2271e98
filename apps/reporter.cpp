#include "h2/apps/reporter.hpp"

#include "h2/core/error.hpp"
#include "h2/core/text.hpp"
#include "h2/scheduler/schedule.hpp"

#include <nlohmann/json.hpp>

#include <cmath>

namespace h2::apps {

namespace {

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", bytes, units[u]);
  return buf;
}

} // namespace

reporter::reporter(const job_config& job, reporter_options options,
                   metrics::registry* registry)
    : job_(job), options_(std::move(options)), registry_(registry) {
  if (!options_.json_log.empty()) {
    // A restarted job goes on with the log of the run it continues.
    json_.open(options_.json_log,
               options_.restarts > 0 ? std::ios::app : std::ios::trunc);
    if (!json_)
      throw error("cannot write the JSON log " + options_.json_log);
    if (options_.restarts > 0)
      json_ << nlohmann::json{{"event", "restart"},
                              {"restarts", options_.restarts}}
                 .dump()
            << '\n'
            << std::flush;
  }
  if (!options_.trace.empty())
    trace_ = std::make_unique<metrics::trace_writer>();
  if (registry_ != nullptr && options_.predicted_step_seconds)
    registry_
      ->get_gauge("h2_predicted_step_seconds",
                  "HeteroAuto's predicted step time of the plan (run clock).")
      .set(*options_.predicted_step_seconds);
  if (registry_ != nullptr)
    registry_
      ->get_gauge("h2_plan_generation",
                  "Plans the job has run: 0 at the start, one more with each "
                  "live rebalance.")
      .set(0);
  if (registry_ != nullptr)
    registry_
      ->get_counter("h2_restarts_total",
                    "Restarts of the job on its surviving chips after a node "
                    "failed ([restart]).")
      .inc(options_.restarts);
}

metrics::label_set reporter::chip_labels(const chip_id& id, int stage) const {
  const chip_spec* c = job_.find_chip(id);
  return {{"chip", id.to_string()},
          {"profile", c != nullptr ? c->profile.name : "?"},
          {"vendor", c != nullptr ? c->profile.vendor : "?"},
          {"node", std::to_string(id.node)},
          {"stage", std::to_string(stage)}};
}

void reporter::on_setup(const plan& p,
                        const std::vector<runtime::setup_report>& chips) {
  std::map<chip_id, const runtime::setup_report*> report_of;
  for (const auto& r : chips)
    report_of[r.chip] = &r;
  std::FILE* out = options_.out;
  if (stage_of_.empty()) // a live rebalance prints only the new stages
    std::fprintf(out,
                 "h2: job \"%s\": %lld-parameter %s, %d layers, %s "
                 "schedule, %s clock\n",
                 printable(job_.name).c_str(),
                 static_cast<long long>(model_parameters(job_.model)),
                 std::string(display_name(job_.model.family)).c_str(),
                 job_.model.num_layers(),
                 std::string(to_string(p.schedule)).c_str(),
                 std::string(to_string(job_.emulation.clock)).c_str());
  for (std::size_t ri = 0; ri < p.replicas.size(); ++ri) {
    const auto& r = p.replicas[ri];
    std::fprintf(out, "h2: replica %zu: %d micro-batches of %d sequences\n", ri,
                 r.micro_batches, r.micro_batch_size);
    const auto positions = stage_positions(r);
    for (std::size_t s = 0; s < r.stages.size(); ++s) {
      const auto& st = r.stages[s];
      // A chip's `stage` label is its pipeline position; its chunks (the
      // plan's stages) are told apart by a `chunk` label.
      const int position = positions[s];
      stage_of_[st.chip] = position;
      const chip_spec* c = job_.find_chip(st.chip);
      auto rep = report_of.find(st.chip);
      std::fprintf(
        out,
        "h2:   stage %zu  chip %-5s %-22s %-4s layers [%2d, %2d)%s%s  "
        "%s of %s\n",
        s, st.chip.to_string().c_str(), c->device.c_str(),
        std::string(to_string(c->compute_dtype)).c_str(), st.first_layer,
        st.end_layer, st.recompute.any() ? " recompute " : "",
        st.recompute.any() ? to_string(st.recompute).c_str() : "",
        rep == report_of.end()
          ? "?"
          : human_bytes(static_cast<double>(rep->second->memory.used)).c_str(),
        rep == report_of.end()
          ? "?"
          : human_bytes(static_cast<double>(rep->second->memory.capacity))
              .c_str());
      if (registry_ != nullptr) {
        auto labels = chip_labels(st.chip, position);
        labels.emplace_back("chunk", std::to_string(s));
        registry_
          ->get_gauge("h2_stage_layers",
                      "Layers the chunk (a stage of the plan) holds in the "
                      "running plan.",
                      labels)
          .set(st.end_layer - st.first_layer);
      }
      if (registry_ != nullptr && rep != report_of.end()) {
        auto labels = chip_labels(st.chip, position);
        registry_
          ->get_gauge("h2_chip_memory_capacity_bytes",
                      "Memory the chip may use (emulated: profile memory x "
                      "memory_scale).",
                      labels)
          .set(static_cast<double>(rep->second->memory.capacity));
        registry_
          ->get_gauge("h2_chip_memory_used_bytes",
                      "Memory the chip holds after its last step.", labels)
          .set(static_cast<double>(rep->second->memory.used));
      }
      if (trace_) {
        trace_->name_thread(st.chip.node, st.chip.index,
                            st.chip.to_string() + " " + c->profile.name +
                              " (stage " + std::to_string(position) + ")");
      }
    }
  }
  if (trace_)
    for (const auto& n : job_.nodes)
      trace_->name_process(n.rank, "node " + std::to_string(n.rank));
  std::fflush(out);
}

void reporter::update_metrics(const runtime::step_summary& s) {
  auto& r = *registry_;
  r.get_counter("h2_steps_total", "Optimizer steps completed.").inc();
  r.get_counter("h2_tokens_total", "Tokens trained on.")
    .inc(static_cast<double>(job_.tokens_per_step()));
  r.get_gauge("h2_step_seconds", "Duration of the last step (run clock).")
    .set(s.step_seconds);
  r.get_histogram(
     "h2_step_duration_seconds", "Step durations (run clock).",
     {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})
    .observe(s.step_seconds);
  r.get_gauge("h2_tokens_per_second", "Throughput of the last step.")
    .set(s.tokens_per_second);
  r.get_gauge("h2_loss", "Training loss of the last step (mean per token, "
                         "nats).")
    .set(s.loss);
  r.get_gauge("h2_learning_rate", "Learning rate of the last step.").set(s.lr);
  r.get_gauge("h2_grad_norm", "Global gradient norm of the last step, "
                              "before clipping.")
    .set(s.grad_norm);
  r.get_gauge("h2_bubble_ratio", "Idle share of the last step's "
                                 "forward/backward phase.")
    .set(s.bubble_fraction);
  for (const auto& c : s.chips) {
    auto labels = chip_labels(c.chip, c.stage);
    r.get_counter("h2_chip_forward_seconds_total",
                  "Time the chip spent in forward passes.", labels)
      .inc(c.forward_seconds);
    r.get_counter("h2_chip_backward_seconds_total",
                  "Time the chip spent in backward passes.", labels)
      .inc(c.backward_seconds);
    r.get_counter("h2_chip_optimizer_seconds_total",
                  "Time the chip spent in optimizer updates.", labels)
      .inc(c.optimizer_seconds);
    r.get_counter("h2_chip_idle_seconds_total",
                  "Time the chip waited in the forward/backward phase.", labels)
      .inc(c.idle_seconds);
    r.get_gauge("h2_chip_memory_used_bytes",
                "Memory the chip holds after its last step.", labels)
      .set(static_cast<double>(c.memory.used));
    r.get_gauge("h2_chip_memory_peak_bytes",
                "Peak memory of the chip during its last step.", labels)
      .set(static_cast<double>(c.memory.peak));
    // Chips count overruns since the start: export the cumulative count.
    auto& overruns = r.get_counter("h2_emulation_overruns_total",
                                   "Ops whose real CPU time exceeded their "
                                   "emulated time (wall clock).",
                                   labels);
    double new_overruns = static_cast<double>(c.overruns) - overruns.value();
    if (new_overruns > 0)
      overruns.inc(new_overruns);
    for (const auto& t : c.traffic) {
      auto channel = labels;
      channel.emplace_back("peer", t.peer.to_string());
      r.get_counter("h2_channel_sent_bytes_total",
                    "Bytes sent to a neighbouring chip.", channel)
        .inc(static_cast<double>(t.sent));
      r.get_counter("h2_channel_received_bytes_total",
                    "Bytes received from a neighbouring chip.", channel)
        .inc(static_cast<double>(t.received));
      r.get_counter("h2_channel_sent_device_bytes_total",
                    "Of the bytes sent to a neighbouring chip, those that "
                    "left from device memory (CUDA IPC, rdma "
                    "device-direct) rather than staged through host memory.",
                    channel)
        .inc(static_cast<double>(t.sent_on_device));
    }
  }
}

void reporter::trace_step(const runtime::step_summary& s) {
  for (const auto& t : s.ops) {
    nlohmann::json args = {{"step", s.step},
                           {"micro_batch", t.op.micro_batch},
                           {"chunk", t.op.chunk}};
    std::string name(runtime::to_string(t.op.kind));
    bool wait = name.rfind("recv", 0) == 0;
    trace_->complete(wait ? "wait " + name.substr(5) : name,
                     wait ? "idle" : "compute", t.chip.node, t.chip.index,
                     t.op.start, std::max(0.0, t.op.end - t.op.start), args);
  }
}

void reporter::on_step(const runtime::step_summary& s) {
  if (registry_ != nullptr)
    update_metrics(s);
  if (auto behind = host_pace_.observe(s)) {
    std::fprintf(options_.out, "h2: warning: %s\n", behind->c_str());
    if (json_.is_open())
      json_ << nlohmann::json{{"event", "host_behind"},
                              {"step", s.step},
                              {"message", *behind}}
                 .dump()
            << '\n';
  }
  if (trace_)
    trace_step(s);
  if (json_.is_open()) {
    nlohmann::json j = {{"event", "step"},
                        {"step", s.step},
                        {"loss", s.loss},
                        {"lr", s.lr},
                        {"grad_norm", s.grad_norm},
                        {"tokens_per_second", s.tokens_per_second},
                        {"step_seconds", s.step_seconds},
                        {"virtual_step_seconds", s.virtual_step_seconds},
                        {"wall_step_seconds", s.wall_step_seconds},
                        {"pipeline_seconds", s.pipeline_seconds},
                        {"bubble_fraction", s.bubble_fraction}};
    j["chips"] = nlohmann::json::array();
    for (const auto& c : s.chips) {
      std::uint64_t sent = 0, sent_on_device = 0;
      for (const auto& t : c.traffic) {
        sent += t.sent;
        sent_on_device += t.sent_on_device;
      }
      j["chips"].push_back({{"chip", c.chip.to_string()},
                            {"stage", c.stage},
                            {"forward_seconds", c.forward_seconds},
                            {"backward_seconds", c.backward_seconds},
                            {"optimizer_seconds", c.optimizer_seconds},
                            {"idle_seconds", c.idle_seconds},
                            // The chip's share of the bubble.
                            {"bubble_fraction",
                             s.pipeline_seconds > 0
                               ? c.idle_seconds / s.pipeline_seconds
                               : 0.0},
                            {"memory_used_bytes", c.memory.used},
                            {"memory_peak_bytes", c.memory.peak},
                            {"memory_capacity_bytes", c.memory.capacity},
                            {"sent_bytes", sent},
                            {"sent_device_bytes", sent_on_device},
                            {"overruns", c.overruns}});
    }
    json_ << j.dump() << '\n' << std::flush;
  }
  if (!options_.quiet) {
    std::fprintf(options_.out,
                 "step %5d/%d | loss %.4f | lr %.2e | %9.0f tok/s | step "
                 "%.4f s | bubble %5.1f%% | grad norm %.3f\n",
                 s.step + 1, options_.total_steps, s.loss, s.lr,
                 s.tokens_per_second, s.step_seconds, 100.0 * s.bubble_fraction,
                 s.grad_norm);
    std::fflush(options_.out);
  }
}

void reporter::on_checkpoint(int steps, double waited_seconds,
                             double stall_seconds) {
  if (registry_ != nullptr) {
    registry_->get_counter("h2_checkpoints_total",
                           "Checkpoints saved (manifest on disk).")
      .inc();
    registry_
      ->get_counter("h2_checkpoint_wait_seconds_total",
                    "Time steps waited for the previous checkpoint's write.")
      .inc(waited_seconds);
    registry_
      ->get_counter("h2_checkpoint_stall_seconds_total",
                    "Time training stood still for checkpoints: the wait "
                    "for the previous one plus the copy to host memory.")
      .inc(stall_seconds);
  }
  if (json_.is_open())
    json_ << nlohmann::json{{"event", "checkpoint"},
                            {"step", steps},
                            {"waited_seconds", waited_seconds},
                            {"stall_seconds", stall_seconds}}
               .dump()
          << '\n'
          << std::flush;
  if (!options_.quiet) {
    std::fprintf(options_.out,
                 "checkpoint after step %d saved | training stalled %.3f s "
                 "(%.3f s waiting for the previous one)\n",
                 steps, stall_seconds, waited_seconds);
    std::fflush(options_.out);
  }
}

void reporter::on_rebalance(const runtime::rebalance_event& e) {
  const double gain =
    e.before_seconds > 0
      ? (e.before_seconds - e.after_seconds) / e.before_seconds
      : 0;
  if (registry_ != nullptr) {
    auto& r = *registry_;
    r.get_gauge("h2_plan_generation",
                "Plans the job has run: 0 at the start, one more with each "
                "live rebalance.")
      .set(e.generation);
    r.get_counter("h2_rebalances_total", "Live rebalances carried out.",
                  {{"reason", e.reason}})
      .inc();
    r.get_counter("h2_rebalance_moved_bytes_total",
                  "Bytes of layer state (weights and AdamW moments) moved "
                  "between chips by live rebalances.")
      .inc(e.moved_bytes);
    r.get_gauge("h2_rebalance_pause_seconds",
                "Wall time training stood still for the last live "
                "rebalance.")
      .set(e.pause_seconds);
    if (e.after_seconds > 0)
      r.get_gauge("h2_predicted_step_seconds",
                  "HeteroAuto's predicted step time of the plan (run clock).")
        .set(e.after_seconds);
  }
  std::string moves;
  for (const auto& m : e.moves)
    moves += (moves.empty() ? "" : ", ") + m;
  if (json_.is_open())
    json_ << nlohmann::json{{"event", "rebalance"},
                            {"step", e.step},
                            {"generation", e.generation},
                            {"reason", e.reason},
                            {"moves", e.moves},
                            {"moved_bytes", e.moved_bytes},
                            {"route", e.route},
                            {"sent_bytes", e.sent_bytes},
                            {"charged_seconds", e.charged_seconds},
                            {"pause_seconds", e.pause_seconds},
                            {"predicted_before_seconds", e.before_seconds},
                            {"predicted_after_seconds", e.after_seconds},
                            {"plan",
                             nlohmann::json::parse(to_json(e.value, -1))}}
               .dump()
          << '\n'
          << std::flush;
  if (options_.quiet)
    return;
  std::fprintf(options_.out,
               "rebalance before step %d (plan %d): %s | %s | %s moved, "
               "paused %.3f s",
               e.step + 1, e.generation, e.reason.c_str(),
               moves.empty() ? "no layers moved" : moves.c_str(),
               human_bytes(e.moved_bytes).c_str(), e.pause_seconds);
  if (e.before_seconds > 0)
    std::fprintf(options_.out, " | predicted step %.4f s -> %.4f s (%+.1f%%)",
                 e.before_seconds, e.after_seconds, -100.0 * gain);
  if (!e.moves.empty() && e.route != "chip to chip") // the slow way
    std::fprintf(options_.out, " | %s", e.route.c_str());
  std::fprintf(options_.out, "\n");
  std::fflush(options_.out);
}

void reporter::on_eval(int step, double val_loss) {
  if (registry_ != nullptr)
    registry_
      ->get_gauge("h2_validation_loss",
                  "Validation loss of the last evaluation (mean per token, "
                  "nats).")
      .set(val_loss);
  if (json_.is_open())
    json_ << nlohmann::json{{"event", "eval"},
                            {"step", step},
                            {"val_loss", val_loss}}
               .dump()
          << '\n'
          << std::flush;
  if (!options_.quiet) {
    std::fprintf(options_.out, "eval after step %d | val loss %.4f\n", step + 1,
                 val_loss);
    std::fflush(options_.out);
  }
}

void reporter::finish(const runtime::run_summary& s) {
  std::FILE* out = options_.out;
  std::fprintf(out, "h2: %s after %d step%s: loss %.4f",
               s.stopped_early ? "stopped" : "done", s.steps,
               s.steps == 1 ? "" : "s", s.final_loss);
  if (s.final_val_loss >= 0)
    std::fprintf(out, ", val loss %.4f", s.final_val_loss);
  std::fprintf(out, ", %.0f tok/s, %.4f s/step, bubble %.1f%% (%s clock)\n",
               s.tokens_per_second, s.mean_step_seconds,
               100.0 * s.mean_bubble_fraction,
               std::string(to_string(job_.emulation.clock)).c_str());
  if (options_.predicted_step_seconds && s.steps > 0)
    std::fprintf(out,
                 "h2: measured %.4f s/step against HeteroAuto's predicted "
                 "%.4f s (ratio %.3f)\n",
                 s.mean_step_seconds, *options_.predicted_step_seconds,
                 s.mean_step_seconds / *options_.predicted_step_seconds);
  if (job_.emulation.clock == clock_mode::wall && s.virtual_seconds > 0)
    std::fprintf(out,
                 "h2: wall time %.2f s for %.2f s of emulated time "
                 "(ratio %.3f)\n",
                 s.wall_seconds, s.virtual_seconds,
                 s.wall_seconds / s.virtual_seconds);
  if (json_.is_open())
    json_ << nlohmann::json{{"event", "summary"},
                            {"steps", s.steps},
                            {"stopped_early", s.stopped_early},
                            {"final_loss", s.final_loss},
                            {"final_val_loss", s.final_val_loss},
                            {"mean_step_seconds", s.mean_step_seconds},
                            {"predicted_step_seconds",
                             options_.predicted_step_seconds
                               ? nlohmann::json(
                                   *options_.predicted_step_seconds)
                               : nlohmann::json(nullptr)},
                            {"tokens_per_second", s.tokens_per_second},
                            {"mean_bubble_fraction", s.mean_bubble_fraction},
                            {"virtual_seconds", s.virtual_seconds},
                            {"wall_seconds", s.wall_seconds}}
               .dump()
          << '\n'
          << std::flush;
  if (trace_) {
    trace_->write(options_.trace);
    std::fprintf(out, "h2: trace written to %s (open in ui.perfetto.dev)\n",
                 options_.trace.c_str());
  }
  std::fflush(out);
}

} // namespace h2::apps
