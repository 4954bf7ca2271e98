#include "h2/runtime/stage_worker.hpp"

#include "stage_worker_context.hpp"

#include "h2/devices/emulated/cost_function.hpp"
#include "h2/model/optim.hpp"
#include "h2/runtime/links.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "h2/transport/collectives.hpp"
#include "h2/transport/tags.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <thread>

namespace h2::runtime {

using transport::tag_kind;

stage_worker::stage_worker(worker_setup setup) : setup_(std::move(setup)) {
  const job_config& job = *setup_.job;
  H2_ENFORCE(setup_.chip != nullptr, "worker without a chip");
  device_ = devices::make_device(
    *setup_.chip, job.emulation,
    devices::chip_clock(job.emulation.clock, setup_.origin, setup_.cancel),
    job.train.threads_per_chip);
  devices::thread_binding bind(*device_);
  H2_ENFORCE(!setup_.chunks.empty(), "chip ", setup_.chip->id.to_string(),
             " holds no chunk");
  for (const auto& c : setup_.chunks)
    chunks_.push_back(std::make_unique<model::stage>(job.model, c.first_layer,
                                                     c.end_layer, job.seed,
                                                     device_->torch_device()));
  adopt_plan();
  timeout_ = std::chrono::duration<double>(job.transport.timeout_seconds);
  loss_scale_ = 1.0 / static_cast<double>(job.tokens_per_step());
}

void stage_worker::adopt_plan() {
  const job_config& job = *setup_.job;
  for (auto& [peer, link] : setup_.peers)
    if (link.channel) // this plan's bounds, also on kept channels
      link.channel->set_limits(setup_.limits);
  H2_ENFORCE(chunks_.size() == setup_.chunks.size(), "chip ",
             setup_.chip->id.to_string(), " built ", chunks_.size(),
             " chunks of ", setup_.chunks.size());
  layers_.clear();
  bool needs_data = false;
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    chunks_[i]->set_recompute(setup_.chunks[i].recompute);
    needs_data =
      needs_data || chunks_[i]->has_embedding() || chunks_[i]->has_head();
    for (const auto& l : chunks_[i]->layers())
      layers_.push_back(l.get());
  }
  shard_optimizer_state();
  if (needs_data && !data_)
    data_ = model::make_data_source(job);
  schedule_ = scheduler::make_schedule(setup_.schedule, setup_.layout,
                                       setup_.micro_batches, setup_.times);
  work_.clear();
  forward_share_.clear();
  backward_share_.clear();
  double forward_total = 0, backward_total = 0;
  attention_work_ = attention_core_work(job.model, setup_.micro_batch_size,
                                        device_->compute_dtype());
  for (const auto& c : setup_.chunks) {
    auto& work = work_.emplace_back();
    for (int l = c.first_layer; l < c.end_layer; ++l)
      work.push_back(compute_layer_work(job.model, l, setup_.micro_batch_size,
                                        device_->compute_dtype()));
    // A layer's recomputed forward, as a share of the chunk's backward.
    int blocks = 0;
    for (const auto& w : work) {
      auto f = device_->layer_seconds(w, devices::pass::forward);
      // What the schedule's backward of the layer is charged: fused, or B
      // and W.
      auto b = device_->layer_seconds(w, devices::pass::backward);
      if (b && scheduler::splits_backward(setup_.schedule))
        b = *device_->layer_seconds(w, devices::pass::backward_input) +
            *device_->layer_seconds(w, devices::pass::backward_weight);
      forward_share_.push_back(f ? *f : w.forward_flops);
      backward_share_.push_back(b ? *b : w.backward_flops);
      switch (recomputed_part_of(c.recompute, w.kind, blocks)) {
        case recomputed_part::forward:
          backward_share_.back() += forward_share_.back();
          break;
        case recomputed_part::attention: {
          auto a =
            device_->layer_seconds(attention_work_, devices::pass::forward);
          backward_share_.back() += a ? *a : attention_work_.forward_flops;
          break;
        }
        case recomputed_part::nothing:
          break;
      }
      blocks += w.kind == layer_kind::block ? 1 : 0;
      forward_total += forward_share_.back();
      backward_total += backward_share_.back();
    }
  }
  const auto n = static_cast<double>(layers_.size());
  for (auto& x : forward_share_)
    x = forward_total > 0 ? x / forward_total : 1.0 / n;
  for (auto& x : backward_share_)
    x = backward_total > 0 ? x / backward_total : 1.0 / n;
}

stage_worker::~stage_worker() {
  close_channels();
}

scheduler::schedule_times schedule_times_of(const job_config& job,
                                            const replica_plan& r) {
  scheduler::schedule_times out;
  for (const auto& st : r.stages) {
    const chip_spec* chip = job.find_chip(st.chip);
    H2_ENFORCE(chip != nullptr, "no chip ", st.chip.to_string());
    const devices::emulated_cost_function cost(
      chip->profile, chip->compute_dtype, job.emulation.time_scale,
      job.emulation.overhead_scale);
    double forward = 0, input = 0, weight = 0;
    std::vector<layer_work> work;
    for (int l = st.first_layer; l < st.end_layer; ++l) {
      const auto& w = work.emplace_back(compute_layer_work(
        job.model, l, r.micro_batch_size, chip->compute_dtype));
      forward += cost.layer_seconds(w, devices::pass::forward);
      input += cost.layer_seconds(w, devices::pass::backward_input);
      weight += cost.layer_seconds(w, devices::pass::backward_weight);
    }
    out.forward.push_back(forward);
    // B recomputes.
    out.input.push_back(
      input +
      recomputed_forward(
        st.recompute, work,
        attention_core_work(job.model, r.micro_batch_size, chip->compute_dtype),
        [&](const layer_work& w) {
          return cost.layer_seconds(w, devices::pass::forward);
        }));
    out.weight.push_back(weight);
  }
  return out;
}

std::vector<worker_setup>
make_worker_setups(const std::shared_ptr<const job_config>& job,
                   const plan& p,
                   devices::chip_clock::wall_clock::time_point origin,
                   const std::shared_ptr<const cancellation>& cancel) {
  std::vector<worker_setup> out;
  const auto groups = reduction_groups(p);
  const auto limits = channel_limits_of(*job, p);
  int first_sequence = 0;
  for (std::size_t ri = 0; ri < p.replicas.size(); ++ri) {
    const auto& r = p.replicas[ri];
    const auto chips = replica_chips(r);
    const auto layout = scheduler::layout_of(r);
    const auto times = schedule_times_of(*job, r);
    std::vector<chip_id> chunk_chips;
    for (const auto& st : r.stages)
      chunk_chips.push_back(st.chip);
    for (int k = 0; k < layout.chips; ++k) {
      const chip_id& id = chips[static_cast<std::size_t>(k)];
      worker_setup w;
      w.job = job;
      w.chip = job->find_chip(id);
      H2_ENFORCE(w.chip != nullptr, "no chip ", id.to_string());
      w.replica = static_cast<int>(ri);
      w.stage = k;
      w.stages = layout.chips;
      w.layout = layout;
      w.chunk_chips = chunk_chips;
      w.micro_batch_size = r.micro_batch_size;
      w.micro_batches = r.micro_batches;
      w.first_sequence = first_sequence;
      w.schedule = p.schedule;
      w.times = times;
      w.limits = limits;
      w.origin = origin;
      w.cancel = cancel;
      for (std::size_t c = 0; c < r.stages.size(); ++c) {
        if (chunk_chips[c] != id)
          continue;
        w.chunks.push_back(r.stages[c]);
        w.chunk_index.push_back(static_cast<int>(c));
        // Pipeline neighbours on other chips.
        if (c > 0 && chunk_chips[c - 1] != id)
          w.peers[chunk_chips[c - 1]] = {};
        if (c + 1 < chunk_chips.size() && chunk_chips[c + 1] != id)
          w.peers[chunk_chips[c + 1]] = {};
      }
      // Tied embeddings: the chips of the first and the last chunk sum the
      // tied gradient (tie_gradients).
      if (job->model.tie_embeddings &&
          chunk_chips.front() != chunk_chips.back()) {
        if (chunk_chips.front() == id)
          w.peers[chunk_chips.back()] = {};
        if (chunk_chips.back() == id)
          w.peers[chunk_chips.front()] = {};
      }
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const auto& group = groups[g];
        const int size = static_cast<int>(group.members.size());
        if (group.members[ri] != id)
          continue;
        reduction_assignment red;
        red.group = static_cast<int>(g);
        red.first_layer = group.first_layer;
        red.end_layer = group.end_layer;
        red.rank = static_cast<int>(ri);
        red.size = size;
        red.next = group.members[(ri + 1) % group.members.size()];
        red.prev = group.members[(ri + group.members.size() - 1) %
                                 group.members.size()];
        w.peers[red.next] = {};
        w.peers[red.prev] = {};
        w.reductions.push_back(red);
      }
      w.zero1 = p.shards_optimizer();
      out.push_back(std::move(w));
    }
    first_sequence += r.sequences();
  }
  return out;
}

void worker_setup::close_channels() const noexcept {
  for (const auto& [peer, link] : peers)
    if (link.channel)
      link.channel->close();
}

void stage_worker::close_channels() noexcept {
  setup_.close_channels();
}

void stage_worker::detach_channels() noexcept {
  for (auto& [peer, link] : setup_.peers)
    link.channel.reset();
}

memory_report stage_worker::memory_now() const {
  const auto m = device_->usage();
  return {m.used, m.peak, m.capacity};
}

model::micro_batch stage_worker::load_batch(model::split split,
                                            std::int64_t step,
                                            int first_sequence,
                                            double scale) const {
  auto mb =
    data_->batch(split, step, first_sequence, setup_.micro_batch_size, scale);
  mb.tokens = device_->to_device(mb.tokens);
  mb.targets = device_->to_device(mb.targets);
  expect_held(mb.tokens, "a batch's tokens");
  expect_held(mb.targets, "a batch's targets");
  return mb;
}

void stage_worker::expect_held(const at::Tensor& t, const char* what) const {
  if (!device_->holds(t))
    throw internal_error(
      "chip " + device_->describe() + ": " + what + " is not on the chip (" +
      t.device().str() +
      (t.device().is_cpu() ? ", not charged to its memory" : "") + ")");
}

clock_pair stage_worker::clocks() const {
  const auto& c = device_->clock();
  return {c.virtual_now(), c.wall_now()};
}

std::size_t stage_worker::local_chunk(int chunk) const {
  const auto& idx = setup_.chunk_index;
  const auto it = std::find(idx.begin(), idx.end(), chunk);
  H2_ENFORCE(it != idx.end(), "chip ", device_->id().to_string(),
             " runs an op of chunk ", chunk, ", which it does not hold");
  return static_cast<std::size_t>(it - idx.begin());
}

double stage_worker::layer_seconds(std::size_t local, devices::pass p) const {
  double total = 0;
  for (const auto& w : work_[local]) {
    auto s = device_->layer_seconds(w, p);
    if (!s)
      return -1; // a real device: measure instead
    total += *s;
  }
  return total;
}

void stage_worker::set_throttle(double factor) {
  H2_ENFORCE(factor > 0 && std::isfinite(factor), "throttle factor ", factor);
  if (!device_->layer_seconds(work_.front().front(), devices::pass::forward))
    throw h2::error("chip " + device_->describe() +
                    " is a real device: only emulated chips can be "
                    "throttled");
  throttle_ = factor;
}

namespace {

/// A uniform draw in [-1, 1] from a hash of the op's identity (splitmix64
/// finaliser), so noise does not depend on thread timing.
double noise_draw(std::uint64_t seed, const chip_id& chip, std::int64_t step,
                  recorded_op kind, int micro_batch, int chunk) {
  std::uint64_t x = seed;
  for (std::uint64_t v :
       {static_cast<std::uint64_t>(chip.node),
        static_cast<std::uint64_t>(chip.index),
        static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(kind),
        static_cast<std::uint64_t>(micro_batch),
        static_cast<std::uint64_t>(chunk)}) {
    x += 0x9e3779b97f4a7c15ULL + v;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
  }
  return static_cast<double>(x >> 11) * 0x1.0p-52 - 1.0;
}

} // namespace

std::optional<double> stage_worker::charged(double seconds, std::int64_t step,
                                            recorded_op kind, int micro_batch,
                                            int chunk) const {
  if (seconds < 0)
    return std::nullopt;
  const auto& em = setup_.job->emulation;
  double factor = throttle_;
  if (em.noise > 0)
    factor *= 1 + em.noise * noise_draw(em.noise_seed, device_->id(), step,
                                        kind, micro_batch, chunk);
  return seconds * factor;
}

std::vector<layer_charge>
stage_worker::layer_charges(double forward_seconds,
                            double backward_seconds) const {
  std::vector<layer_charge> out;
  for (std::size_t l = 0; l < layers_.size(); ++l)
    out.push_back({forward_share_[l] * forward_seconds,
                   backward_share_[l] * backward_seconds});
  return out;
}

at::Tensor stage_worker::receive(const chip_id& peer, std::uint64_t tag,
                                 op_context& ctx, int micro_batch) {
  const peer_link& p = setup_.peers.at(peer);
  auto& clock = device_->clock();
  double wait_start = clock.now(), v0 = clock.virtual_now();
  transport::message m = p.channel->recv(tag, timeout_);
  double link = device_->transfer_seconds(m.payload_bytes(), p.profile);
  double idle = clock.complete_receive(wait_start, m.sent.virtual_seconds,
                                       m.sent.wall_seconds, link);
  const auto kind = transport::tag_kind_of(tag);
  if (kind != tag_kind::control) {
    // Waits of the pipeline are its bubble; a reduction's waits are part of
    // the reduction's own op record.
    ctx.idle_seconds += idle;
    ctx.ops.push_back({kind == tag_kind::gradient ? recorded_op::recv_backward
                                                  : recorded_op::recv_forward,
                       micro_batch, wait_start, clock.now(),
                       clock.virtual_now() - v0, transport::tag_chunk(tag)});
    if (kind == tag_kind::activation || kind == tag_kind::gradient) {
      auto& l = ctx.links[peer];
      l.from = peer;
      l.seconds += link;
      ++l.transfers;
    }
  }
  auto t = device_->take(m.tensor);
  if (t.defined())
    expect_held(t, "a received tensor");
  return t;
}

void stage_worker::send(const chip_id& peer, std::uint64_t tag,
                        const at::Tensor& t) {
  transport::channel& ch = *setup_.peers.at(peer).channel;
  const auto& clock = device_->clock();
  transport::message m;
  m.tag = tag;
  m.sent = {clock.virtual_now(), clock.wall_now()};
  m.tensor = t;
  ch.send(std::move(m));
}

void stage_worker::begin_op(const char* op, int micro_batch,
                            std::optional<double> predicted) {
  if (setup_.progress)
    setup_.progress->begin(op, micro_batch, predicted.value_or(-1),
                           watchdog_clock::now());
  if (!hang_)
    return;
  hang_ = false;
  for (;;) {
    check_cancelled(); // how a hang ends: the watchdog, or an abort
    if (setup_.cancel)
      setup_.cancel->wait_until(std::chrono::steady_clock::now() +
                                std::chrono::milliseconds(20));
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void stage_worker::end_op() {
  if (setup_.progress)
    setup_.progress->end(watchdog_clock::now());
}

void stage_worker::check_cancelled() const {
  if (setup_.progress)
    if (auto why = setup_.progress->stalled(); !why.empty())
      throw stalled_error(why);
  if (setup_.cancel && setup_.cancel->cancelled())
    throw cancelled_error("chip " + device_->describe() + ": step aborted");
}

chip_update_report stage_worker::apply_update(const update_command& cmd) {
  return guarded([&] {
    devices::thread_binding bind(*device_);
    auto& clock = device_->clock();
    clock.advance_virtual_to(cmd.virtual_barrier);
    double emulated_seconds = 0;
    for (const auto* l : layers_) {
      std::int64_t updated = 0; // a sharded parameter's share only
      for (const auto& p : l->parameters())
        updated += p.shard_length >= 0 ? p.shard_length : p.value.numel();
      auto s = device_->optimizer_seconds(updated);
      emulated_seconds =
        s && emulated_seconds >= 0 ? emulated_seconds + *s : -1;
    }
    const auto predicted =
      charged(emulated_seconds, cmd.step, recorded_op::optimizer, 0);
    begin_op("optimizer", -1, predicted);
    double w0 = clock.wall_now(), t0 = clock.now(), v0 = clock.virtual_now();
    for (auto* l : layers_)
      model::adamw_update(*l, setup_.job->train, cmd.lr, cmd.step + 1,
                          cmd.clip_coefficient);
    device_->synchronize();
    chip_update_report r;
    r.chip = device_->id();
    r.optimizer_seconds = device_->complete_op(w0, predicted);
    end_op();
    last_step_ = cmd.step;
    if (setup_.zero1) { // inside the op, as in the simulator
      op_context ctx(chunks_.size(), setup_.micro_batches);
      gather_parameters(cmd.step, ctx);
    }
    r.op = {recorded_op::optimizer, 0, t0, clock.now(),
            clock.virtual_now() - v0};
    r.end = clocks();
    r.memory = memory_now();
    return r;
  });
}

std::vector<parameter_values> stage_worker::parameters() const {
  std::vector<parameter_values> out;
  for (const auto* l : layers_)
    for (const auto& p : l->parameters()) {
      auto t = device_->to_host(p.value.detach()).contiguous();
      const float* data = t.data_ptr<float>();
      out.push_back({p.name, t.sizes().vec(),
                     std::vector<float>(data, data + t.numel()), l->index()});
    }
  return out;
}

std::vector<layer_state> stage_worker::snapshot() {
  return guarded([&] {
    devices::thread_binding bind(*device_);
    std::vector<layer_state> out;
    if (!setup_.zero1) {
      for (const auto* l : layers_)
        out.push_back(snapshot_layer(*device_, *l));
      return out;
    }
    // Every replica gathers its groups' moments; replica 0 holds the
    // layers' whole state, which the others have too (docs/checkpoints.md).
    op_context ctx(chunks_.size(), setup_.micro_batches);
    auto gathered = gather_moments(ctx);
    if (setup_.replica == 0)
      for (const auto* l : layers_)
        out.push_back(snapshot_layer(*device_, *l, &gathered));
    return out;
  });
}

void stage_worker::restore(const std::vector<layer_state>& states) {
  guarded([&] {
    devices::thread_binding bind(*device_);
    for (auto* l : layers_) {
      const layer_state* mine = nullptr;
      for (const auto& s : states)
        if (s.layer == l->index())
          mine = &s;
      if (mine == nullptr)
        throw checkpoint_error(checkpoint_errc::mismatch, "",
                               "no state for layer " +
                                 std::to_string(l->index()) + " of chip " +
                                 device_->id().to_string());
      restore_layer(*device_, *l, *mine);
    }
  });
}

void stage_worker::tie_gradients(std::int64_t step, op_context& ctx) {
  if (!setup_.job->model.tie_embeddings)
    return;
  model::parameter *embedding = nullptr, *head = nullptr;
  const int last = setup_.job->model.num_layers() - 1;
  for (auto* l : layers_) {
    if (l->index() == 0)
      embedding = model::tied_weight(*l);
    if (l->index() == last)
      head = model::tied_weight(*l);
  }
  if (embedding == nullptr && head == nullptr)
    return;
  auto& clock = device_->clock();
  const double t0 = clock.now(), v0 = clock.virtual_now();
  const auto tag =
    transport::collective_tag(step, transport::tied_embedding_group, 0, 0);
  at::Tensor sum;
  if (embedding != nullptr && head != nullptr) {
    sum = model::tied_gradient(embedding->value.grad(), head->value.grad(),
                               embedding->value);
  } else {
    // Each side sends its own and adds the other's, embedding + head.
    auto* own = embedding != nullptr ? embedding : head;
    const auto& peer = embedding != nullptr ? setup_.chunk_chips.back()
                                            : setup_.chunk_chips.front();
    auto mine = own->value.grad();
    if (!mine.defined())
      mine = at::zeros_like(own->value);
    send(peer, tag, mine);
    const auto theirs = receive(peer, tag, ctx, 0);
    sum = embedding != nullptr ? model::tied_gradient(mine, theirs, own->value)
                               : model::tied_gradient(theirs, mine, own->value);
  }
  for (auto* p : {embedding, head})
    if (p != nullptr)
      p->value.mutable_grad() =
        p == head && embedding != nullptr ? sum.clone() : sum;
  ctx.ops.push_back(
    {recorded_op::allreduce, 0, t0, clock.now(), clock.virtual_now() - v0});
}

setup_report stage_worker::ready_report() const {
  std::int64_t parameters = 0;
  for (const auto& c : chunks_)
    parameters += c->parameter_count();
  return {device_->id(), parameters, memory_now()};
}

} // namespace h2::runtime
