// A chip's step: the op list of its chunk (scheduler/schedule.hpp) run on
// its device, and the forward-only validation pass.
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

stage_worker::op_seconds stage_worker::emulated_op_seconds() const {
  op_seconds out;
  out.forward = layer_seconds(devices::pass::forward);
  out.backward = layer_seconds(devices::pass::backward);
  out.input = layer_seconds(devices::pass::backward_input);
  out.weight = layer_seconds(devices::pass::backward_weight);
  if (out.forward < 0 || out.backward < 0 || out.input < 0 || out.weight < 0)
    return {-1, -1, -1, -1}; // a real device: every op is measured
  if (setup_.assignment.recompute) {
    out.backward += out.forward;
    out.input += out.forward; // B rebuilds the activations
  }
  return out;
}

template <class F>
double stage_worker::timed_op(const char* name, recorded_op kind, int mb,
                              std::optional<double> predicted, op_context& ctx,
                              F&& body) {
  auto& clock = device_->clock();
  begin_op(name, mb, predicted);
  const double w0 = clock.wall_now(), t0 = clock.now(),
               v0 = clock.virtual_now();
  body();
  device_->synchronize();
  const double seconds = device_->complete_op(w0, predicted);
  end_op();
  const double charged_seconds = clock.virtual_now() - v0;
  (kind == recorded_op::forward ? ctx.forward_charged : ctx.backward_charged) +=
    charged_seconds;
  ctx.ops.push_back({kind, mb, t0, clock.now(), charged_seconds});
  return seconds;
}

void stage_worker::forward_op(int mb, const step_command& cmd,
                              const op_seconds& seconds, op_context& ctx,
                              chip_step_report& r) {
  const auto i = static_cast<std::size_t>(mb);
  if (data_)
    ctx.batch[i] = load_batch(
      model::split::train, cmd.step,
      setup_.first_sequence + mb * setup_.micro_batch_size, loss_scale_);
  at::Tensor out;
  r.forward_seconds += timed_op(
    "forward", recorded_op::forward, mb,
    charged(seconds.forward, cmd.step, recorded_op::forward, mb), ctx, [&] {
      devices::compute_scope scope(*device_);
      std::optional<at::NoGradGuard> no_grad;
      if (setup_.assignment.recompute)
        no_grad.emplace();
      out = stage_->forward(ctx.input[i], ctx.batch[i]);
    });
  expect_held(out, "a forward's output");
  if (stage_->has_head())
    r.loss += out.item<double>();
  ctx.output[i] = out;
}

void stage_worker::backward_op(int mb, bool split, const step_command& cmd,
                               const op_seconds& seconds, op_context& ctx,
                               chip_step_report& r) {
  const auto i = static_cast<std::size_t>(mb);
  const bool first = setup_.stage == 0;
  const auto kind = split ? recorded_op::backward_input : recorded_op::backward;
  const double predicted_seconds = split ? seconds.input : seconds.backward;
  r.backward_seconds +=
    timed_op(split ? "backward_input" : "backward", kind, mb,
             charged(predicted_seconds, cmd.step, kind, mb), ctx, [&] {
               if (setup_.assignment.recompute) {
                 devices::compute_scope scope(*device_);
                 ctx.output[i] = stage_->forward(ctx.input[i], ctx.batch[i]);
               }
               const at::Tensor gradient =
                 stage_->has_head() ? at::Tensor() : ctx.grad[i];
               if (split) {
                 // B: the input gradients; the weight gradients wait for W
                 // (model/split_backward.hpp).
                 std::vector<at::Tensor> parameters;
                 for (const auto& l : stage_->layers())
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

void stage_worker::weight_op(int mb, const step_command& cmd,
                             const op_seconds& seconds, op_context& ctx,
                             chip_step_report& r) {
  const auto i = static_cast<std::size_t>(mb);
  r.backward_seconds += timed_op(
    "backward_weight", recorded_op::backward_weight, mb,
    charged(seconds.weight, cmd.step, recorded_op::backward_weight, mb), ctx,
    [&] {
      // W: the weight gradients B left, from the gradients it captured;
      // bitwise those of the fused backward.
      ctx.weight_work[i].run();
    });
}

void stage_worker::run_op(const scheduler::op& x, const step_command& cmd,
                          const op_seconds& seconds, op_context& ctx,
                          chip_step_report& r) {
  const int mb = x.micro_batch;
  const auto i = static_cast<std::size_t>(mb);
  switch (x.kind) {
    case op_kind::recv_forward: {
      auto t =
        receive(*setup_.prev,
                make_tag(tag_kind::activation, cmd.step, mb, x.chunk), ctx, mb);
      t.set_requires_grad(true);
      ctx.input[i] = t;
      return;
    }
    case op_kind::forward:
      forward_op(mb, cmd, seconds, ctx, r);
      return;
    case op_kind::send_forward:
      send(*setup_.next,
           make_tag(tag_kind::activation, cmd.step, mb, x.chunk + 1),
           ctx.output[i].detach());
      if (setup_.assignment.recompute)
        ctx.output[i] = at::Tensor(); // recomputed in the backward
      return;
    case op_kind::recv_backward:
      ctx.grad[i] =
        receive(*setup_.next,
                make_tag(tag_kind::gradient, cmd.step, mb, x.chunk), ctx, mb);
      return;
    case op_kind::backward:
      backward_op(mb, false, cmd, seconds, ctx, r);
      return;
    case op_kind::backward_input:
      backward_op(mb, true, cmd, seconds, ctx, r);
      return;
    case op_kind::backward_weight:
      weight_op(mb, cmd, seconds, ctx, r);
      return;
    case op_kind::send_backward:
      send(*setup_.prev,
           make_tag(tag_kind::gradient, cmd.step, mb, x.chunk - 1),
           ctx.input_grad[i]);
      ctx.input_grad[i] = at::Tensor();
      return;
  }
  H2_ENFORCE(false, "unknown op_kind ", static_cast<int>(x.kind));
}

chip_step_report stage_worker::run_step(const step_command& cmd) {
  return guarded([&] {
    devices::thread_binding bind(*device_);
    auto& clock = device_->clock();
    clock.advance_virtual_to(cmd.virtual_barrier);
    device_->reset_peak();
    stage_->zero_grad();
    chip_step_report r;
    r.chip = device_->id();
    r.replica = setup_.replica;
    r.stage = setup_.stage;
    r.first_layer = setup_.assignment.first_layer;
    r.start = clocks();
    auto traffic_before = traffic_of(setup_);
    op_context ctx(setup_.micro_batches);
    const op_seconds seconds = emulated_op_seconds();
    for (const auto& x :
         schedule_.ops[static_cast<std::size_t>(setup_.stage)]) {
      check_cancelled();
      run_op(x, cmd, seconds, ctx, r);
    }
    reduce_gradients(cmd.step, ctx);
    r.phase_end = clocks();
    for (const auto& l : stage_->layers())
      r.layer_squared_norms.push_back(model::squared_grad_norm(*l));
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
    auto ops = scheduler::make_forward_schedule(setup_.stages, total)
                 .ops[static_cast<std::size_t>(setup_.stage)];
    op_context ctx(total);
    at::NoGradGuard no_grad;
    chip_eval_report r;
    r.chip = device_->id();
    const double forward_emulated = layer_seconds(devices::pass::forward);
    for (const auto& op : ops) {
      const int mb = op.micro_batch;
      const auto i = static_cast<std::size_t>(mb);
      check_cancelled();
      switch (op.kind) {
        case op_kind::recv_forward:
          ctx.input[i] =
            receive(*setup_.prev,
                    make_tag(tag_kind::eval_activation, cmd.step, mb, op.chunk),
                    ctx, mb);
          break;
        case op_kind::forward: {
          model::micro_batch batch;
          if (data_)
            batch = load_batch(model::split::validation, mb / m,
                               setup_.first_sequence + (mb % m) * size, scale);
          double w0 = clock.wall_now();
          {
            devices::compute_scope scope(*device_);
            ctx.output[i] = stage_->forward(ctx.input[i], batch);
          }
          ctx.input[i] = at::Tensor();
          device_->synchronize();
          device_->complete_op(
            w0, charged(forward_emulated, cmd.step, recorded_op::forward, mb));
          if (stage_->has_head()) {
            r.loss += ctx.output[i].item<double>();
            ctx.output[i] = at::Tensor();
          }
          break;
        }
        case op_kind::send_forward:
          send(*setup_.next,
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
