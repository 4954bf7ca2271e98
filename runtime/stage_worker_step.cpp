// A chip's step: the op list over its chunks (scheduler/schedule.hpp) run
// on its device, and the forward-only validation pass.
#include "h2/runtime/stage_worker.hpp"

#include "stage_worker_context.hpp"

#include "h2/model/optim.hpp"
#include "h2/transport/tags.hpp"

#include <ATen/core/grad_mode.h>

namespace h2::runtime {

using scheduler::op_kind;
using transport::make_tag;
using transport::tag_kind;

namespace {

/// Traffic per neighbour so far.
std::vector<channel_traffic> traffic_of(const worker_setup& s) {
  std::vector<channel_traffic> out;
  for (const auto& [peer, link] : s.peers) {
    auto st = link.channel->stats();
    out.push_back(
      {peer, st.bytes_sent, st.bytes_received, st.bytes_sent_on_device});
  }
  return out;
}

} // namespace

std::vector<stage_worker::op_seconds>
stage_worker::emulated_op_seconds() const {
  std::vector<op_seconds> out;
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    op_seconds s;
    s.forward = layer_seconds(c, devices::pass::forward);
    s.backward = layer_seconds(c, devices::pass::backward);
    s.input = layer_seconds(c, devices::pass::backward_input);
    s.weight = layer_seconds(c, devices::pass::backward_weight);
    if (s.forward < 0 || s.backward < 0 || s.input < 0 || s.weight < 0)
      s = {-1, -1, -1, -1}; // a real device: every op is measured
    else {
      // B rebuilds the activations.
      const double again = recomputed_forward(
        setup_.chunks[c].recompute, work_[c], attention_work_,
        [&](const layer_work& w) {
          return *device_->layer_seconds(w, devices::pass::forward);
        });
      s.backward += again;
      s.input += again;
    }
    out.push_back(s);
  }
  return out;
}

template <class F>
double stage_worker::timed_op(const char* name, recorded_op kind,
                              const scheduler::op& x,
                              std::optional<double> predicted, op_context& ctx,
                              F&& body) {
  auto& clock = device_->clock();
  begin_op(name, x.micro_batch, predicted);
  const double w0 = clock.wall_now(), t0 = clock.now(),
               v0 = clock.virtual_now();
  body();
  device_->synchronize();
  const double seconds = device_->complete_op(w0, predicted);
  end_op();
  const double charged_seconds = clock.virtual_now() - v0;
  (kind == recorded_op::forward ? ctx.forward_charged : ctx.backward_charged) +=
    charged_seconds;
  ctx.ops.push_back(
    {kind, x.micro_batch, t0, clock.now(), charged_seconds, x.chunk});
  return seconds;
}

bool stage_worker::chunk_here(int chunk) const {
  return chunk >= 0 && chunk < static_cast<int>(setup_.chunk_chips.size()) &&
         setup_.chunk_chips[static_cast<std::size_t>(chunk)] == device_->id();
}

void stage_worker::forward_op(const scheduler::op& x, const step_command& cmd,
                              const std::vector<op_seconds>& seconds,
                              op_context& ctx, chip_step_report& r) {
  const std::size_t c = local_chunk(x.chunk);
  const std::size_t i = ctx.slot(c, x.micro_batch);
  model::stage& chunk = *chunks_[c];
  const bool recompute = setup_.chunks[c].recompute.full;
  if (chunk_here(x.chunk - 1)) {
    // The previous chunk ran here: its output is this one's input, handed
    // over on the chip (schedule.hpp: no send, no receive).
    const std::size_t prev = ctx.slot(c - 1, x.micro_batch);
    ctx.input[i] = ctx.output[prev].detach().requires_grad_(true);
    if (setup_.chunks[c - 1].recompute.full)
      ctx.output[prev] = at::Tensor(); // recomputed in its backward
  }
  if (chunk.has_embedding() || chunk.has_head())
    ctx.batch[i] = load_batch(model::split::train, cmd.step,
                              setup_.first_sequence +
                                x.micro_batch * setup_.micro_batch_size,
                              loss_scale_);
  at::Tensor out;
  r.forward_seconds +=
    timed_op("forward", recorded_op::forward, x,
             charged(seconds[c].forward, cmd.step, recorded_op::forward,
                     x.micro_batch, x.chunk),
             ctx, [&] {
               devices::compute_scope scope(*device_);
               std::optional<at::NoGradGuard> no_grad;
               if (recompute)
                 no_grad.emplace();
               out = chunk.forward(ctx.input[i], ctx.batch[i]);
             });
  expect_held(out, "a forward's output");
  if (chunk.has_head())
    r.loss += out.item<double>();
  ctx.output[i] = out;
}

void stage_worker::backward_op(const scheduler::op& x, bool split,
                               const step_command& cmd,
                               const std::vector<op_seconds>& seconds,
                               op_context& ctx, chip_step_report& r) {
  const std::size_t c = local_chunk(x.chunk);
  const std::size_t i = ctx.slot(c, x.micro_batch);
  model::stage& chunk = *chunks_[c];
  const bool first = x.chunk == 0;
  if (chunk_here(x.chunk + 1)) {
    // The next chunk's backward ran here: its input gradient is this
    // chunk's output gradient.
    const std::size_t next = ctx.slot(c + 1, x.micro_batch);
    ctx.grad[i] = ctx.input_grad[next];
    ctx.input_grad[next] = at::Tensor();
  }
  const auto kind = split ? recorded_op::backward_input : recorded_op::backward;
  const double predicted_seconds =
    split ? seconds[c].input : seconds[c].backward;
  r.backward_seconds +=
    timed_op(split ? "backward_input" : "backward", kind, x,
             charged(predicted_seconds, cmd.step, kind, x.micro_batch, x.chunk),
             ctx, [&] {
               if (setup_.chunks[c].recompute.full) {
                 devices::compute_scope scope(*device_);
                 ctx.output[i] = chunk.forward(ctx.input[i], ctx.batch[i]);
               }
               const at::Tensor gradient =
                 chunk.has_head() ? at::Tensor() : ctx.grad[i];
               if (split) {
                 // B: the input gradients; the weight gradients wait for W
                 // (model/split_backward.hpp).
                 std::vector<at::Tensor> parameters;
                 for (const auto& l : chunk.layers())
                   for (const auto& p : l->parameters())
                     parameters.push_back(p.value);
                 auto [input_grad, weight_work] =
                   model::deferred_weight_gradients::backward_input(
                     ctx.output[i], gradient, ctx.input[i], parameters);
                 ctx.input_grad[i] = input_grad;
                 ctx.weight_work[i] = std::move(weight_work);
               } else {
                 ctx.output[i].backward(gradient);
                 if (!first)
                   ctx.input_grad[i] = ctx.input[i].grad();
               }
               ctx.output[i] = at::Tensor();
               ctx.grad[i] = at::Tensor();
               ctx.batch[i] = model::micro_batch();
               ctx.input[i] = at::Tensor();
             });
}

void stage_worker::weight_op(const scheduler::op& x, const step_command& cmd,
                             const std::vector<op_seconds>& seconds,
                             op_context& ctx, chip_step_report& r) {
  const std::size_t c = local_chunk(x.chunk);
  const std::size_t i = ctx.slot(c, x.micro_batch);
  r.backward_seconds +=
    timed_op("backward_weight", recorded_op::backward_weight, x,
             charged(seconds[c].weight, cmd.step, recorded_op::backward_weight,
                     x.micro_batch, x.chunk),
             ctx, [&] {
               // W: the weight gradients B left, from the gradients it
               // captured; bitwise those of the fused backward.
               ctx.weight_work[i].run();
             });
}

const chip_id& stage_worker::chip_of_chunk(int chunk) const {
  H2_ENFORCE(chunk >= 0 && chunk < static_cast<int>(setup_.chunk_chips.size()),
             "chunk ", chunk, " of ", setup_.chunk_chips.size());
  return setup_.chunk_chips[static_cast<std::size_t>(chunk)];
}

void stage_worker::run_op(const scheduler::op& x, const step_command& cmd,
                          const std::vector<op_seconds>& seconds,
                          op_context& ctx, chip_step_report& r) {
  const int mb = x.micro_batch;
  switch (x.kind) {
    case op_kind::recv_forward: {
      auto t =
        receive(chip_of_chunk(x.chunk - 1),
                make_tag(tag_kind::activation, cmd.step, mb, x.chunk), ctx, mb);
      t.set_requires_grad(true);
      ctx.input[ctx.slot(local_chunk(x.chunk), mb)] = t;
      return;
    }
    case op_kind::forward:
      forward_op(x, cmd, seconds, ctx, r);
      return;
    case op_kind::send_forward: {
      const std::size_t c = local_chunk(x.chunk);
      auto& out = ctx.output[ctx.slot(c, mb)];
      send(chip_of_chunk(x.chunk + 1),
           make_tag(tag_kind::activation, cmd.step, mb, x.chunk + 1),
           out.detach());
      if (setup_.chunks[c].recompute.full)
        out = at::Tensor(); // recomputed in the backward
      return;
    }
    case op_kind::recv_backward:
      ctx.grad[ctx.slot(local_chunk(x.chunk), mb)] =
        receive(chip_of_chunk(x.chunk + 1),
                make_tag(tag_kind::gradient, cmd.step, mb, x.chunk), ctx, mb);
      return;
    case op_kind::backward:
      backward_op(x, false, cmd, seconds, ctx, r);
      return;
    case op_kind::backward_input:
      backward_op(x, true, cmd, seconds, ctx, r);
      return;
    case op_kind::backward_weight:
      weight_op(x, cmd, seconds, ctx, r);
      return;
    case op_kind::send_backward: {
      auto& g = ctx.input_grad[ctx.slot(local_chunk(x.chunk), mb)];
      send(chip_of_chunk(x.chunk - 1),
           make_tag(tag_kind::gradient, cmd.step, mb, x.chunk - 1), g);
      g = at::Tensor();
      return;
    }
  }
  H2_ENFORCE(false, "unknown op_kind ", static_cast<int>(x.kind));
}

chip_step_report stage_worker::run_step(const step_command& cmd) {
  return guarded([&] {
    devices::thread_binding bind(*device_);
    auto& clock = device_->clock();
    clock.advance_virtual_to(cmd.virtual_barrier);
    device_->reset_peak();
    for (auto& c : chunks_)
      c->zero_grad();
    chip_step_report r;
    r.chip = device_->id();
    r.replica = setup_.replica;
    r.stage = setup_.stage;
    r.first_layer = setup_.first_layer();
    r.start = clocks();
    auto traffic_before = traffic_of(setup_);
    op_context ctx(chunks_.size(), setup_.micro_batches);
    const auto seconds = emulated_op_seconds();
    for (const auto& x :
         schedule_.ops[static_cast<std::size_t>(setup_.stage)]) {
      check_cancelled();
      run_op(x, cmd, seconds, ctx, r);
    }
    reduce_gradients(cmd.step, ctx);
    tie_gradients(cmd.step, ctx);
    r.phase_end = clocks();
    for (const auto* l : layers_)
      r.layer_ids.push_back(l->index());
    r.layer_squared_norms = squared_norms();
    r.norm_shares = setup_.zero1;
    r.idle_seconds = ctx.idle_seconds;
    r.memory = memory_now();
    r.traffic = traffic_of(setup_);
    for (std::size_t i = 0; i < r.traffic.size(); ++i) {
      r.traffic[i].sent -= traffic_before[i].sent;
      r.traffic[i].received -= traffic_before[i].received;
      r.traffic[i].sent_on_device -= traffic_before[i].sent_on_device;
    }
    r.overruns = clock.overruns();
    r.overrun_seconds = clock.overrun_seconds();
    r.ops = std::move(ctx.ops);
    const double m = setup_.micro_batches;
    r.layers = layer_charges(ctx.forward_charged / m, ctx.backward_charged / m);
    for (auto& [peer, l] : ctx.links)
      r.links.push_back(l);
    return r;
  });
}

chip_eval_report stage_worker::run_eval(const eval_command& cmd) {
  return guarded([&] {
    devices::thread_binding bind(*device_);
    auto& clock = device_->clock();
    clock.advance_virtual_to(cmd.virtual_barrier);
    const job_config& job = *setup_.job;
    const int m = setup_.micro_batches;
    const int size = setup_.micro_batch_size;
    const int total = m * job.train.eval_batches;
    const double scale = loss_scale_ / job.train.eval_batches;
    auto ops = scheduler::make_forward_schedule(setup_.layout, total)
                 .ops[static_cast<std::size_t>(setup_.stage)];
    op_context ctx(chunks_.size(), total);
    at::NoGradGuard no_grad;
    chip_eval_report r;
    r.chip = device_->id();
    for (const auto& op : ops) {
      const int mb = op.micro_batch;
      const std::size_t c = local_chunk(op.chunk);
      const std::size_t i = ctx.slot(c, mb);
      check_cancelled();
      switch (op.kind) {
        case op_kind::recv_forward:
          ctx.input[i] =
            receive(chip_of_chunk(op.chunk - 1),
                    make_tag(tag_kind::eval_activation, cmd.step, mb, op.chunk),
                    ctx, mb);
          break;
        case op_kind::forward: {
          model::stage& chunk = *chunks_[c];
          if (chunk_here(op.chunk - 1)) {
            auto& prev = ctx.output[ctx.slot(c - 1, mb)];
            ctx.input[i] = prev;
            prev = at::Tensor();
          }
          model::micro_batch batch;
          if (chunk.has_embedding() || chunk.has_head())
            batch = load_batch(model::split::validation, mb / m,
                               setup_.first_sequence + (mb % m) * size, scale);
          double w0 = clock.wall_now();
          {
            devices::compute_scope scope(*device_);
            ctx.output[i] = chunk.forward(ctx.input[i], batch);
          }
          ctx.input[i] = at::Tensor();
          device_->synchronize();
          device_->complete_op(
            w0, charged(layer_seconds(c, devices::pass::forward), cmd.step,
                        recorded_op::forward, mb, op.chunk));
          if (chunk.has_head()) {
            r.loss += ctx.output[i].item<double>();
            ctx.output[i] = at::Tensor();
          }
          break;
        }
        case op_kind::send_forward:
          send(chip_of_chunk(op.chunk + 1),
               make_tag(tag_kind::eval_activation, cmd.step, mb, op.chunk + 1),
               ctx.output[i]);
          ctx.output[i] = at::Tensor();
          break;
        case op_kind::recv_backward:
        case op_kind::backward:
        case op_kind::send_backward:
        case op_kind::backward_input:
        case op_kind::backward_weight:
          H2_ENFORCE(false, "backward op in a forward-only schedule");
      }
    }
    r.end = clocks();
    return r;
  });
}

} // namespace h2::runtime
