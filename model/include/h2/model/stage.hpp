// A pipeline stage: a contiguous range of global layers on one chip.
#pragma once

#include "h2/core/recompute.hpp"
#include "h2/model/layers.hpp"

#include <memory>
#include <vector>

namespace h2::model {

class stage {
public:
  /// Builds layers [first_layer, end_layer) of `cfg` from `seed` on
  /// `device`, on the calling thread.
  stage(const gpt_config& cfg, int first_layer, int end_layer,
        std::uint64_t seed, c10::Device device = c10::kCPU);

  /// The stage of layers [first_layer, end_layer) of `cfg` made already:
  /// `layers`, one per layer in order, living on `device` (a chip's stage
  /// rebuilt around the layers it keeps in a live re-plan). Throws
  /// h2::internal_error when they are not those layers.
  stage(const gpt_config& cfg, int first_layer, int end_layer,
        std::vector<std::unique_ptr<layer>> layers, c10::Device device);

  /// Hands over the stage's layers; it holds none afterwards.
  std::vector<std::unique_ptr<layer>> release_layers() noexcept {
    return std::move(layers_);
  }

  /// Runs every layer of the stage. The first stage ignores `input` and
  /// embeds mb.tokens; the last returns the scaled loss (a scalar).
  at::Tensor forward(const at::Tensor& input, const micro_batch& mb);

  /// What forward() leaves to be recomputed in the backward: the first
  /// `p.blocks` blocks (each from its input) and the other blocks'
  /// attention cores. `p.full` is the caller's to run (a forward without
  /// grad mode, again with it before the backward); forward() then keeps
  /// everything it runs.
  void set_recompute(const recompute_policy& p);
  const recompute_policy& recompute() const noexcept { return recompute_; }

  int first_layer() const noexcept { return first_; }
  int end_layer() const noexcept { return end_; }
  bool has_embedding() const noexcept { return first_ == 0; }
  bool has_head() const noexcept { return end_ == cfg_.num_layers(); }
  const gpt_config& config() const noexcept { return cfg_; }
  /// Where the stage's parameters live.
  c10::Device device() const noexcept { return device_; }

  /// The stage's layers, in order.
  const std::vector<std::unique_ptr<layer>>& layers() const noexcept {
    return layers_;
  }

  /// Every parameter of the stage, layer by layer.
  std::vector<parameter*> parameters();

  /// Sets every gradient to undefined (frees it) before a step.
  void zero_grad();

  std::int64_t parameter_count() const;

private:
  gpt_config cfg_;
  int first_, end_;
  c10::Device device_;
  std::vector<std::unique_ptr<layer>> layers_;
  recompute_policy recompute_;
};

} // namespace h2::model
