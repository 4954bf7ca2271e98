// What the planner knows about a chip's speed: measurements, never a
// formula. A profiling pass outside scheduler/ (model/profiler.hpp) runs each
// layer kind forward and backward on each chip kind present and answers
// through this interface; the planner asks lazily and only for what it needs
// (memoised per chip kind, layer kind and micro-batch size).
#pragma once

#include "h2/core/job.hpp"

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>

namespace h2::scheduler {

/// Seconds of one layer's forward and backward on one micro-batch.
struct layer_timing {
  double forward_seconds = 0;
  double backward_seconds = 0; ///< fused
  /// B and W of a split backward (each its own op, so together they may
  /// take longer than the fused backward). A source that leaves both 0
  /// gets the backward split by weight_gradient_share().
  double input_seconds = 0;
  double weight_seconds = 0;
  /// Blocks: the forward of the attention core alone (what attention
  /// recomputation adds to the backward). A source that leaves it 0 gets
  /// the forward's share by FLOPs (attention_core_work()).
  double attention_seconds = 0;
};

/// The source of the planner's timings. Implementations measure (on real or
/// emulated chips) or, in tests, make numbers up; they must be
/// deterministic per (chip kind, layer kind, size) for plans to be
/// reproducible. Called from the planner's thread only.
class chip_measurements {
public:
  virtual ~chip_measurements() = default;

  /// Forward and backward seconds of one layer of kind `kind` of the job's
  /// model on a micro-batch of `micro_batch_size` sequences, on a chip like
  /// `chip` (same profile and dtype: chip_kind_key()).
  virtual layer_timing layer(const chip_spec& chip, layer_kind kind,
                             int micro_batch_size) = 0;

  /// Seconds of the optimizer update (AdamW, fp32 master weights) of one
  /// layer of kind `kind` on a chip like `chip`.
  virtual double optimizer(const chip_spec& chip, layer_kind kind) = 0;

  /// The bytes a real chip (cuda, hip) offers: its free memory when opened
  /// minus the reserve (docs/ditorch.md, "Memory"). nullopt: the chip's
  /// profile says (emulated and cpu chips, and sources that do not open
  /// chips).
  virtual std::optional<double> capacity_bytes(const chip_spec&) {
    return std::nullopt;
  }
};

/// chip_measurements answered by two callables (tests, glue code).
class function_measurements final : public chip_measurements {
public:
  using layer_function =
    std::function<layer_timing(const chip_spec&, layer_kind, int)>;
  using optimizer_function =
    std::function<double(const chip_spec&, layer_kind)>;

  function_measurements(layer_function layer, optimizer_function optimizer)
      : layer_(std::move(layer)), optimizer_(std::move(optimizer)) {}

  layer_timing layer(const chip_spec& chip, layer_kind kind,
                     int micro_batch_size) override {
    return layer_(chip, kind, micro_batch_size);
  }
  double optimizer(const chip_spec& chip, layer_kind kind) override {
    return optimizer_(chip, kind);
  }

private:
  layer_function layer_;
  optimizer_function optimizer_;
};

/// The name under which chips share measurements: their profile and dtype,
/// e.g. "h100-sxm/bf16". Two chips with one key run a layer equally fast.
std::string chip_kind_key(const chip_spec& chip);

/// Memoises a chip_measurements: each (chip kind, layer kind, micro-batch
/// size) is asked once. Not thread-safe; `source` must outlive the cache.
class measurement_cache {
public:
  /// `source` and `model` (the job's) must outlive the cache.
  measurement_cache(chip_measurements& source, const gpt_config& model)
      : source_(&source), model_(&model) {}

  /// Throws h2::error when the source returns a negative or non-finite
  /// time. A timing without B and W gets the backward split by
  /// weight_gradient_share().
  layer_timing layer(const chip_spec& chip, layer_kind kind,
                     int micro_batch_size);
  double optimizer(const chip_spec& chip, layer_kind kind);
  /// The source's capacity_bytes(chip), asked once per device.
  std::optional<double> capacity_bytes(const chip_spec& chip);

  /// What answers the cache's misses.
  chip_measurements& source() const noexcept { return *source_; }

  /// How many measurements the source was asked for so far.
  std::size_t measurements_taken() const noexcept {
    return layers_.size() + optimizers_.size();
  }

private:
  chip_measurements* source_;
  const gpt_config* model_;
  std::map<std::tuple<std::string, layer_kind, int>, layer_timing> layers_;
  std::map<std::pair<std::string, layer_kind>, double> optimizers_;
  std::map<std::string, std::optional<double>> capacities_; ///< by device
};

} // namespace h2::scheduler
