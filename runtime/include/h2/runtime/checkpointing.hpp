// A job's checkpoints (docs/checkpoints.md): the manifest of a job at a
// step, whether a checkpoint may resume a job, and the background writer
// that saves while training goes on. Plain C++ with a thread of its own; the
// actors only hand it snapshots and pass its callbacks on as messages.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/runtime/checkpoint_files.hpp"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace h2::runtime {

/// The manifest of `job` under `p` (the saver sets its step with at_step;
/// files are filled by write_checkpoint): model shape, optimizer and
/// schedule keys, seed, a CRC32C of each token file (for shards: of their
/// manifest, and the tokenizer's hash), the plan and the job file's text.
/// Hashes the token files: make it once per run. Throws
/// checkpoint_error(io) when a token file cannot be read.
checkpoint_manifest job_manifest(const job_config& job, const plan& p,
                                 const std::string& job_text);

/// The key under which a manifest's data_hashes record the tokenizer of
/// token shards.
inline constexpr const char* tokenizer_hash_key = "tokenizer";

/// Sets `m`'s step to `step` and its data position: the training
/// sequences read so far (step x global batch) and, for token shards, the
/// epoch and the position in it (docs/data.md, "Order").
void at_step(checkpoint_manifest& m, std::int64_t step);

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

/// The file in checkpoint.dir through which the nodes of a job check that
/// they all see the same directory (docs/checkpoints.md).
inline constexpr std::string_view checkpoint_marker_file = "h2-job-marker";

/// Writes a fresh random marker into `root`/checkpoint_marker_file
/// (creating `root`), durably, and returns it. Throws checkpoint_error(io).
std::string write_checkpoint_marker(const std::filesystem::path& root);

/// Throws config_error("checkpoint.dir") naming node `rank` unless `root`'s
/// marker file reads `expected`: the node does not see the directory rank 0
/// wrote it into (not shared storage, another path).
void check_checkpoint_marker(const std::filesystem::path& root,
                             const std::string& expected, int rank);

/// Whether `files`, reported as written by the chip whose stages (chunks)
/// are `chunks`, may join the records `so_far` of the same checkpoint:
/// every one of a layer of those stages, none twice, none recorded already.
/// The scheduler drops a report that is not (a forged or repeated message
/// must not publish a manifest early).
bool files_of_chip(const std::vector<file_record>& files,
                   const std::vector<stage_plan>& chunks,
                   const std::vector<file_record>& so_far);

/// One node's checkpoint writes, on a thread of its own, in the order they
/// were queued (docs/checkpoints.md). Every node of a job has one: each
/// writes the layer files of the layers its chips own; the writer of the
/// node that drives the job (the scheduler's) also publishes each
/// checkpoint's manifest once every layer file is on disk, and prunes.
/// Callbacks run on the writer's thread. Thread-safe.
class checkpoint_writer {
public:
  /// The records of the layer files written, or why they could not be.
  using layers_written =
    std::function<void(std::vector<file_record>, std::exception_ptr)>;
  /// The manifest is on disk (and older checkpoints pruned), or why not.
  using published = std::function<void(std::exception_ptr)>;

  checkpoint_writer(std::filesystem::path root, int keep);
  /// close().
  ~checkpoint_writer();

  checkpoint_writer(const checkpoint_writer&) = delete;
  checkpoint_writer& operator=(const checkpoint_writer&) = delete;

  const std::filesystem::path& root() const noexcept { return root_; }

  /// Queues writing `layers` as layer files of the checkpoint `id` names,
  /// into its partial directory (which prepare_checkpoint_dir made ready);
  /// `done` gets their records.
  void write_layers(checkpoint_identity id, std::vector<layer_state> layers,
                    layers_written done);

  /// Queues publishing `manifest` (its files filled) with
  /// publish_checkpoint, then pruning the job's checkpoints to `keep`.
  void publish(checkpoint_manifest manifest, published done);

  /// Gives up on every write not yet finished (a second signal, a failed
  /// job): the write in progress stops before its next file, queued ones
  /// write nothing, and no manifest is written from now on, so the
  /// previous checkpoint stays the latest. Their callbacks get a
  /// cancelled_error. Returns at once.
  void abandon() noexcept;

  /// Finishes the queued writes (unless abandoned) and stops the thread;
  /// writes queued afterwards are dropped. Call it before whatever the
  /// callbacks talk to goes away. Idempotent.
  void close();

private:
  void run();
  /// Throws cancelled_error once abandoned.
  void check_abandoned() const;

  std::filesystem::path root_;
  int keep_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::once_flag joined_;
  std::atomic<bool> abandoned_{false};
  std::thread thread_;
};

} // namespace h2::runtime
