#include "h2/scheduler/measurements.hpp"

#include "h2/core/error.hpp"

#include <cmath>

namespace h2::scheduler {

namespace {

void check_seconds(double s, const chip_spec& chip, std::string_view what) {
  if (!std::isfinite(s) || s < 0)
    throw error("measurement of " + std::string(what) + " on chip " +
                chip.id.to_string() + " (" + chip.device +
                ") is not a time: " + std::to_string(s));
}

} // namespace

std::string chip_kind_key(const chip_spec& chip) {
  return chip.profile.name + "/" + std::string(to_string(chip.compute_dtype));
}

layer_timing measurement_cache::layer(const chip_spec& chip, layer_kind kind,
                                      int micro_batch_size) {
  auto key = std::make_tuple(chip_kind_key(chip), kind, micro_batch_size);
  auto it = layers_.find(key);
  if (it != layers_.end())
    return it->second;
  layer_timing t = source_->layer(chip, kind, micro_batch_size);
  check_seconds(t.forward_seconds, chip, to_string(kind));
  check_seconds(t.backward_seconds, chip, to_string(kind));
  if (t.input_seconds == 0 && t.weight_seconds == 0) {
    // A source that times only the fused backward: split it by FLOPs.
    const int index = kind == layer_kind::embedding ? 0
                      : kind == layer_kind::block   ? 1
                                                    : model_->n_layer + 1;
    t.weight_seconds =
      t.backward_seconds *
      weight_gradient_share(compute_layer_work(*model_, index, micro_batch_size,
                                               chip.compute_dtype));
    t.input_seconds = t.backward_seconds - t.weight_seconds;
  }
  if (kind == layer_kind::block && t.attention_seconds == 0) {
    const auto w =
      compute_layer_work(*model_, 1, micro_batch_size, chip.compute_dtype);
    t.attention_seconds =
      t.forward_seconds *
      attention_core_work(*model_, micro_batch_size, chip.compute_dtype)
        .forward_flops /
      w.forward_flops;
  }
  check_seconds(t.input_seconds, chip, to_string(kind));
  check_seconds(t.weight_seconds, chip, to_string(kind));
  check_seconds(t.attention_seconds, chip, to_string(kind));
  layers_.emplace(key, t);
  return t;
}

double measurement_cache::optimizer(const chip_spec& chip, layer_kind kind) {
  auto key = std::make_pair(chip_kind_key(chip), kind);
  auto it = optimizers_.find(key);
  if (it != optimizers_.end())
    return it->second;
  double s = source_->optimizer(chip, kind);
  check_seconds(s, chip, "optimizer");
  optimizers_.emplace(key, s);
  return s;
}

std::optional<double> measurement_cache::capacity_bytes(const chip_spec& chip) {
  auto it = capacities_.find(chip.device);
  if (it == capacities_.end())
    it = capacities_.emplace(chip.device, source_->capacity_bytes(chip)).first;
  return it->second;
}

} // namespace h2::scheduler
