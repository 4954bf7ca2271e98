#include "h2/model/profiler.hpp"

#include "h2/core/error.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/layers.hpp"
#include "h2/model/ops.hpp"
#include "h2/model/optim.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace h2::model {

namespace {

/// Any global layer index of `kind`.
int layer_index(const gpt_config& cfg, layer_kind kind) {
  switch (kind) {
    case layer_kind::embedding:
      return 0;
    case layer_kind::block:
      return 1;
    case layer_kind::head:
      return cfg.n_layer + 1;
  }
  return 1;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
    .count();
}

} // namespace

chip_profiler::chip_profiler(const job_config& job, int repeats)
    : job_(&job), repeats_(std::max(1, repeats)) {
}

chip_profiler::~chip_profiler() = default;

devices::device_context& chip_profiler::device(const chip_spec& chip) {
  std::string key =
    chip.profile.name + "/" + std::string(to_string(chip.compute_dtype));
  auto it = devices_.find(key);
  if (it == devices_.end()) {
    devices::chip_clock clock(clock_mode::virtual_clock,
                              devices::chip_clock::wall_clock::now());
    it = devices_
           .emplace(key, devices::make_device(chip, job_->emulation, clock,
                                              job_->train.threads_per_chip))
           .first;
  }
  return *it->second;
}

layer_profile chip_profiler::layer(const chip_spec& chip, layer_kind kind,
                                   int micro_batch_size) {
  const auto& cfg = job_->model;
  auto& dev = device(chip);
  const int index = layer_index(cfg, kind);
  const layer_work work =
    compute_layer_work(cfg, index, micro_batch_size, dev.compute_dtype());
  auto f = dev.layer_seconds(work, devices::pass::forward);
  auto b = dev.layer_seconds(work, devices::pass::backward);
  auto bi = dev.layer_seconds(work, devices::pass::backward_input);
  auto bw = dev.layer_seconds(work, devices::pass::backward_weight);
  if (f && b && bi && bw) {
    layer_profile out{*f, *b, *bi, *bw, 0};
    if (kind == layer_kind::block)
      out.attention_seconds = *dev.layer_seconds(
        attention_core_work(cfg, micro_batch_size, dev.compute_dtype()),
        devices::pass::forward);
    return out;
  }

  // A real chip: time the layer itself, as the runtime runs it.
  devices::thread_binding bind(dev);
  auto l = make_layer(cfg, index, job_->seed, dev.torch_device());
  const std::int64_t n = micro_batch_size, t = cfg.seq_len;
  micro_batch mb;
  mb.tokens = dev.to_device(at::randint(cfg.vocab_size, {n, t}, at::kLong));
  mb.targets = dev.to_device(at::randint(cfg.vocab_size, {n, t}, at::kLong));
  mb.loss_scale = 1.0 / static_cast<double>(n * t);
  at::Tensor input;
  if (kind != layer_kind::embedding)
    input = dev.to_device(at::randn({n, t, cfg.d_model}, at::kFloat))
              .requires_grad_(true);
  std::vector<at::Tensor> params;
  for (auto& p : l->parameters())
    params.push_back(p.value);
  std::vector<double> fwd, bwd, bin, bwt;
  auto forward = [&] {
    for (auto& p : l->parameters())
      p.value.mutable_grad() = at::Tensor();
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor out;
    {
      devices::compute_scope scope(dev);
      out = l->forward(input, mb);
    }
    dev.synchronize();
    return std::make_pair(out, seconds_since(t0));
  };
  // backward(gradient, retain, create, inputs), timed.
  auto backward = [&](const at::Tensor& out, bool retain,
                      c10::optional<at::TensorList> inputs) {
    auto t0 = std::chrono::steady_clock::now();
    out.backward(kind == layer_kind::head ? at::Tensor() : at::ones_like(out),
                 retain, false, inputs);
    dev.synchronize();
    return seconds_since(t0);
  };
  for (int run = 0; run <= repeats_; ++run) {
    auto [out, tf] = forward();
    double tb = backward(out, false, c10::nullopt);
    // The same layer with the backward split, as a zero-bubble schedule
    // runs it: B (input gradients, the graph kept), then W.
    auto split = forward().first;
    double ti = 0;
    if (input.defined()) {
      const std::vector<at::Tensor> inputs{input};
      ti = backward(split, true, inputs);
    }
    double tw = backward(split, false, params);
    if (run > 0) { // the first run warms caches and allocators up
      fwd.push_back(tf);
      bwd.push_back(tb);
      bin.push_back(ti);
      bwt.push_back(tw);
    }
  }
  layer_profile out{median(fwd), median(bwd), median(bin), median(bwt), 0};
  if (kind == layer_kind::block)
    out.attention_seconds = attention_seconds(dev, micro_batch_size);
  return out;
}

double chip_profiler::attention_seconds(devices::device_context& dev,
                                        int micro_batch_size) {
  const auto& cfg = job_->model;
  devices::thread_binding bind(dev);
  const std::int64_t n = micro_batch_size, t = cfg.seq_len, hd = cfg.head_dim();
  auto heads = [&](std::int64_t h) {
    return dev.to_device(at::randn({n, h, t, hd}, at::kFloat));
  };
  const auto q = heads(cfg.n_head), k = heads(cfg.kv_heads()),
             v = heads(cfg.kv_heads());
  const auto mask = ops::causal_mask(t, dev.torch_device());
  std::vector<double> runs;
  for (int run = 0; run <= repeats_; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    {
      at::NoGradGuard no_grad;
      devices::compute_scope scope(dev);
      ops::attention(q, k, v, mask);
    }
    dev.synchronize();
    if (run > 0)
      runs.push_back(seconds_since(t0));
  }
  return median(runs);
}

std::uint64_t chip_profiler::capacity_bytes(const chip_spec& chip) {
  return device(chip).usage().capacity;
}

double chip_profiler::optimizer(const chip_spec& chip, layer_kind kind) {
  const auto& cfg = job_->model;
  auto& dev = device(chip);
  const int index = layer_index(cfg, kind);
  if (auto s = dev.optimizer_seconds(layer_parameters(cfg, index)))
    return *s;
  devices::thread_binding bind(dev);
  auto l = make_layer(cfg, index, job_->seed, dev.torch_device());
  for (auto& p : l->parameters())
    p.value.mutable_grad() = at::zeros_like(p.value);
  std::vector<double> times;
  for (int run = 0; run <= repeats_; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    adamw_update(*l, job_->train, job_->train.lr, run + 1, 1.0);
    dev.synchronize();
    if (run > 0)
      times.push_back(seconds_since(t0));
  }
  return median(times);
}

} // namespace h2::model
