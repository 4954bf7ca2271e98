// Training on one chip without a pipeline: the whole model as one stage on
// the calling thread, the same micro-batches, loss weighting, clipping and
// AdamW as the runtime. The reference the pipeline is compared with, and the
// bare loop the single-chip benchmark measures H2 against.
#pragma once

#include "h2/core/job.hpp"
#include "h2/model/data.hpp"
#include "h2/model/stage.hpp"

#include <memory>
#include <vector>

namespace h2::model {

class single_chip_trainer {
public:
  /// Builds the whole model on `device` and the job's data source, on the
  /// calling thread. Computes in fp32.
  explicit single_chip_trainer(const job_config& job,
                               c10::Device device = c10::kCPU);

  /// One optimizer step (0-based `step`) over the job's global batch in
  /// micro-batches of train.micro_batch; returns the step's loss. Without
  /// `backward_order` each micro-batch runs forward then backward; with it,
  /// every forward runs first and the backwards follow in that order (the
  /// order a schedule accumulates gradients in).
  double train_step(int step, const std::vector<int>& backward_order = {});

  stage& model() noexcept { return model_; }

private:
  job_config job_;
  c10::Device device_;
  stage model_;
  std::unique_ptr<data_source> data_;
};

} // namespace h2::model
