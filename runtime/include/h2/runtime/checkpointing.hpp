// A job's checkpoints (docs/checkpoints.md): the manifest of a job at a
// step, whether a checkpoint may resume a job, and the background writer
// that saves while training goes on. Plain C++ with a thread of its own; the
// scheduler actor only hands it snapshots.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/runtime/checkpoint_files.hpp"

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace h2::runtime {

/// The manifest of `job` under `p` (the saver sets its step; files are
/// filled by write_checkpoint): model shape, optimizer and schedule keys,
/// seed, a CRC32C of each token file, the plan and the job file's text.
/// Hashes the token files: make it once per run. Throws
/// checkpoint_error(io) when a token file cannot be read.
checkpoint_manifest job_manifest(const job_config& job, const plan& p,
                                 const std::string& job_text);

/// Checks that the checkpoint described by `saved` continues `job`: the
/// model shape, the data (source, files and their hashes), the global
/// batch, the seed, and the optimizer and schedule keys must be the same;
/// chips, nodes, plan, dtypes, transport, metrics, checkpoint keys and
/// train.steps may differ. `dir` names the checkpoint in errors. Throws
/// config_error naming the first key that differs, e.g. "model.d_model:
/// the checkpoint <dir> has 64, the job 32". Also refuses a checkpoint at
/// or past train.steps.
void check_resumable(const checkpoint_manifest& saved, const job_config& job,
                     const std::filesystem::path& dir);

/// Writes checkpoints on a thread of its own, one at a time, then prunes to
/// `keep`. Thread-safe.
class checkpoint_writer {
public:
  checkpoint_writer(std::filesystem::path root, int keep);
  /// Waits for the write in progress (its error, if any, is dropped).
  ~checkpoint_writer();

  checkpoint_writer(const checkpoint_writer&) = delete;
  checkpoint_writer& operator=(const checkpoint_writer&) = delete;

  /// Starts writing `layers` under `manifest` in the background, after the
  /// previous write finished. Returns the seconds spent waiting for it (the
  /// training stall a save adds beyond its snapshot). Rethrows the
  /// previous write's error (checkpoint_error).
  double save(checkpoint_manifest manifest, std::vector<layer_state> layers);

  /// Waits until nothing is being written; rethrows a write's error.
  void finish();

private:
  void run();

  std::filesystem::path root_;
  int keep_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  checkpoint_manifest next_manifest_;
  std::vector<layer_state> next_layers_;
  std::thread thread_;
};

} // namespace h2::runtime
