// What a chip does with its replicas (docs/transport.md, Collectives): the
// all-reduce of its gradients and, under ZeRO-1 (docs/planner.md, "Sharded
// optimizer state"), the reduce-scatter, the all-gather of the updated
// parameters, and the gather of the sharded moments for a snapshot.
#include "h2/runtime/stage_worker.hpp"

#include "stage_worker_context.hpp"

#include "h2/model/optim.hpp"
#include "h2/runtime/optimizer_shards.hpp"
#include "h2/transport/collectives.hpp"

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace h2::runtime {

namespace {

std::vector<std::int64_t> numels_of(const std::vector<model::parameter*>& ps) {
  std::vector<std::int64_t> out;
  for (const auto* p : ps)
    out.push_back(p->value.numel());
  return out;
}

/// Bucket `b` of `ps` flattened into one fresh fp32 tensor: each
/// parameter's gradient (zeros where none), or its value.
at::Tensor flatten(const std::vector<model::parameter*>& ps,
                   const gradient_bucket& b, bool gradients) {
  std::vector<at::Tensor> parts;
  for (std::size_t i = b.first; i < b.end; ++i) {
    auto& p = *ps[i];
    if (!gradients) {
      parts.push_back(p.value.detach().reshape({-1}));
      continue;
    }
    auto& g = p.value.mutable_grad();
    if (!g.defined())
      g = at::zeros_like(p.value);
    parts.push_back(g.reshape({-1}));
  }
  return at::cat(parts);
}

/// Copies the elements of bucket `b`'s flat tensor back into each
/// parameter's gradient or value: all of them, or with `shares` only each
/// parameter's share.
void unflatten(const at::Tensor& flat, const std::vector<model::parameter*>& ps,
               const gradient_bucket& b, bool gradients, bool shares) {
  at::NoGradGuard no_grad;
  std::int64_t at = 0;
  for (std::size_t i = b.first; i < b.end; ++i) {
    auto& p = *ps[i];
    auto target = gradients ? p.value.mutable_grad() : p.value;
    const auto n = target.numel();
    std::int64_t offset = 0, length = n;
    if (shares) {
      offset = p.shard_offset;
      length = p.shard_length;
    }
    target.view({-1})
      .narrow(0, offset, length)
      .copy_(flat.narrow(0, at + offset, length));
    at += n;
  }
}

/// True when bucket `b` of `params` holds a sharded parameter.
bool has_shares(const std::vector<model::parameter*>& params,
                const gradient_bucket& b) {
  for (std::size_t i = b.first; i < b.end; ++i)
    if (params[i]->shard_length >= 0)
      return true;
  return false;
}

/// Gathers the moments of the sharded parameters of bucket `b` over the
/// ring into host copies, by tensor name, into `out`.
void gather_bucket_moments(const devices::device_context& device,
                           const std::vector<model::parameter*>& params,
                           const gradient_bucket& b,
                           transport::allreduce_options options,
                           transport::ring_io& io, int rank, int size,
                           std::map<std::string, state_tensor>& out) {
  for (int moment = 0; moment < 2; ++moment) {
    at::Tensor flat = at::zeros({b.numel}, params[b.first]->value.options());
    std::int64_t at = 0;
    for (std::size_t i = b.first; i < b.end; ++i) {
      auto& p = *params[i];
      if (p.shard_length >= 0)
        flat.narrow(0, at + p.shard_offset, p.shard_length)
          .copy_(moment == 0 ? p.exp_avg : p.exp_avg_sq);
      at += p.value.numel();
    }
    // Past the ring steps of a step's reduce-scatter and all-gather.
    transport::ring_allgather(flat, rank, size, options, io,
                              (2 + moment) * (size - 1));
    at = 0;
    for (std::size_t i = b.first; i < b.end; ++i) {
      auto& p = *params[i];
      if (p.shard_length >= 0) {
        auto name = p.name + (moment == 0 ? ".exp_avg" : ".exp_avg_sq");
        auto whole = flat.narrow(0, at, p.value.numel()).view_as(p.value);
        out.emplace(name, host_copy(device, name, whole));
      }
      at += p.value.numel();
    }
  }
}

} // namespace

std::vector<model::parameter*>
stage_worker::parameters_of(const reduction_assignment& red) const {
  std::vector<model::parameter*> out;
  for (auto* l : layers_)
    if (l->index() >= red.first_layer && l->index() < red.end_layer)
      for (auto& p : l->parameters())
        out.push_back(&p);
  return out;
}

void stage_worker::shard_optimizer_state() {
  if (!setup_.zero1)
    return;
  const auto bucket_bytes = setup_.job->transport.bucket_bytes;
  for (const auto& red : setup_.reductions) {
    const auto params = parameters_of(red);
    const auto shares =
      owned_shares(numels_of(params), bucket_bytes, red.rank, red.size);
    // A tied table is summed with its copy after the reduction: its whole
    // gradient is on both chips, and its moments stay whole.
    std::vector<const model::parameter*> tied;
    if (setup_.job->model.tie_embeddings)
      for (auto* l : layers_)
        tied.push_back(model::tied_weight(*l));
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto& p = *params[i];
      if (std::find(tied.begin(), tied.end(), &p) != tied.end())
        continue;
      p.shard_offset = shares[i].offset;
      p.shard_length = shares[i].length;
    }
  }
}

template <class F>
void stage_worker::for_each_bucket(op_context& ctx,
                                   transport::allreduce_options& options,
                                   F&& f) {
  const auto bucket_bytes = setup_.job->transport.bucket_bytes;
  for (const auto& red : setup_.reductions) {
    // Every member holds the same parameters of the group, so every member
    // cuts the same buckets.
    const auto params = parameters_of(red);
    transport::ring_io io{
      [&](std::uint64_t tag, const at::Tensor& t) { send(red.next, tag, t); },
      [&](std::uint64_t tag) { return receive(red.prev, tag, ctx, 0); },
      {}};
    options.group = red.group;
    options.bucket = 0;
    for (const auto& b : cut_buckets(numels_of(params), bucket_bytes)) {
      f(params, b, red, io);
      ++options.bucket;
    }
  }
}

void stage_worker::reduce_gradients(std::int64_t step, op_context& ctx) {
  if (setup_.reductions.empty())
    return;
  const auto& transport = setup_.job->transport;
  auto& clock = device_->clock();
  const double t0 = clock.now(), v0 = clock.virtual_now();
  transport::allreduce_options options;
  options.step = step;
  options.wire_dtype =
    transport.reduce_dtype == dtype::bf16 ? at::kBFloat16 : at::kFloat;
  for_each_bucket(
    ctx, options,
    [&](const std::vector<model::parameter*>& params, const gradient_bucket& b,
        const reduction_assignment& red, transport::ring_io& io) {
      at::Tensor flat = flatten(params, b, true);
      // Under ZeRO-1 the reduce-scatter alone, unless the bucket holds a
      // parameter kept whole: the same sums as the all-reduce's.
      bool whole = !setup_.zero1;
      for (std::size_t i = b.first; i < b.end; ++i)
        whole = whole || params[i]->shard_length < 0;
      if (whole)
        transport::ring_allreduce(flat, red.rank, red.size, options, io);
      else
        transport::ring_reduce_scatter(flat, red.rank, red.size, options, io);
      unflatten(flat, params, b, true, !whole);
    });
  ctx.ops.push_back(
    {recorded_op::allreduce, 0, t0, clock.now(), clock.virtual_now() - v0});
}

std::vector<double> stage_worker::squared_norms() const {
  std::vector<double> out;
  for (const auto* l : layers_) {
    if (!setup_.zero1) {
      out.push_back(model::squared_grad_norm(*l));
      continue;
    }
    // Parameter by parameter in fp64, as squared_grad_norm sums them.
    double sum = 0;
    for (const auto& p : l->parameters()) {
      const auto& g = p.value.grad();
      if (!g.defined() || p.tied)
        continue;
      if (p.shard_length >= 0)
        sum += g.reshape({-1})
                 .narrow(0, p.shard_offset, p.shard_length)
                 .to(at::kDouble)
                 .square()
                 .sum()
                 .item<double>();
      else if (setup_.replica == 0) // whole on every replica: counted once
        sum += g.to(at::kDouble).square().sum().item<double>();
    }
    out.push_back(sum);
  }
  return out;
}

void stage_worker::gather_parameters(std::int64_t step, op_context& ctx) {
  transport::allreduce_options options; // fp32: the master weights
  options.step = step;
  for_each_bucket(ctx, options,
                  [&](const std::vector<model::parameter*>& params,
                      const gradient_bucket& b, const reduction_assignment& red,
                      transport::ring_io& io) {
                    // A bucket of whole parameters (all-reduced, updated
                    // alike everywhere) has nothing to gather; in a mixed
                    // one a whole parameter's owner share changes nothing.
                    if (!has_shares(params, b))
                      return;
                    at::Tensor flat = flatten(params, b, false);
                    // The ring steps the reduce-scatter's all-reduce would have
                    // used.
                    transport::ring_allgather(flat, red.rank, red.size, options,
                                              io, red.size - 1);
                    unflatten(flat, params, b, false, false);
                  });
}

std::map<std::string, state_tensor>
stage_worker::gather_moments(op_context& ctx) {
  std::map<std::string, state_tensor> out;
  transport::allreduce_options options;
  options.step = last_step_;
  for_each_bucket(ctx, options,
                  [&](const std::vector<model::parameter*>& params,
                      const gradient_bucket& b, const reduction_assignment& red,
                      transport::ring_io& io) {
                    // Every member updated (or restored) the same buckets; a
                    // bucket of whole parameters only has nothing to gather.
                    bool updated = false;
                    for (std::size_t i = b.first; i < b.end; ++i)
                      updated = updated || params[i]->exp_avg.defined();
                    if (has_shares(params, b) && updated)
                      gather_bucket_moments(*device_, params, b, options, io,
                                            red.rank, red.size, out);
                  });
  return out;
}

} // namespace h2::runtime
