// The profiling pass of HeteroAuto (docs/planner.md, "Measurements"): how
// long one layer of each kind takes, forward and backward, on a chip kind,
// and how long its optimizer update takes. The planner (scheduler/) sees
// chips only through these figures.
//
// It lives in model/ because on real chips it runs real layers (model ->
// devices); on emulated chips it asks the device context for the time the
// op would be charged (layer_seconds()): that is what a run on that chip
// takes, so no math is needed and 100B-parameter layers cost nothing.
#pragma once

#include "h2/core/job.hpp"

#include <map>
#include <memory>
#include <string>
#include <tuple>

namespace h2::devices {
class device_context;
}

namespace h2::model {

/// Seconds of one layer's ops on one micro-batch.
struct layer_profile {
  double forward_seconds = 0;
  double backward_seconds = 0; ///< fused
  double input_seconds = 0;    ///< B of a split backward
  double weight_seconds = 0;   ///< W of a split backward
  /// Blocks: the forward of the attention core alone (what attention
  /// recomputation adds to the backward); 0 for other kinds.
  double attention_seconds = 0;
};

/// Measures layers of one job's model on chips of that job. Device
/// contexts are created lazily, one per chip kind (profile and dtype), on
/// the calling thread; call from one thread only.
class chip_profiler {
public:
  /// `job` must outlive the profiler. `repeats`: timed runs per real-chip
  /// measurement (the median counts), after one warm-up run.
  explicit chip_profiler(const job_config& job, int repeats = 3);
  ~chip_profiler();
  chip_profiler(const chip_profiler&) = delete;
  chip_profiler& operator=(const chip_profiler&) = delete;

  /// Forward and backward of one `kind` layer on `micro_batch_size`
  /// sequences on a chip like `chip`. Throws device_error when the device
  /// is unavailable or (real chips) the layer does not fit its memory.
  layer_profile layer(const chip_spec& chip, layer_kind kind,
                      int micro_batch_size);

  /// The AdamW update of one `kind` layer on a chip like `chip`.
  double optimizer(const chip_spec& chip, layer_kind kind);

  /// What `chip` may hold: its device context's capacity (a GPU's free
  /// memory when opened minus the reserve). Throws device_error when the
  /// device is unavailable.
  std::uint64_t capacity_bytes(const chip_spec& chip);

private:
  devices::device_context& device(const chip_spec& chip);
  /// The attention core's forward on a real chip, timed.
  double attention_seconds(devices::device_context& dev, int micro_batch_size);

  const job_config* job_;
  int repeats_;
  std::map<std::string, std::unique_ptr<devices::device_context>> devices_;
};

} // namespace h2::model
