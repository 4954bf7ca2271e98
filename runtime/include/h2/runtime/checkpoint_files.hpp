// The files of a checkpoint (docs/checkpoints.md): one safetensors file per
// global layer plus a JSON manifest, so a checkpoint written under one
// pipeline plan loads under any other. Pure I/O and validation: no actors,
// no training code. Every read treats every byte as hostile and fails with a
// checkpoint_error naming the file; no partial checkpoint is ever returned.
#pragma once

#include "h2/runtime/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace h2::runtime {

/// The manifest's "format" value: what marks a directory as H2's checkpoint.
inline constexpr std::string_view checkpoint_format = "h2-checkpoint";

/// The manifest format version this build writes and reads.
inline constexpr int checkpoint_format_version = 2;

/// The manifest's file name in a checkpoint directory. Its temporary file
/// while being written is "manifest.json.tmp".
inline constexpr std::string_view manifest_file_name = "manifest.json";

/// What the manifest says of one layer file.
struct file_record {
  std::string file; ///< "layer-00003.safetensors", relative to the dir
  int layer = 0;
  std::uint64_t bytes = 0;            ///< size of the whole file
  std::uint32_t crc32c = 0;           ///< CRC32C of the whole file
  std::vector<tensor_record> tensors; ///< in the file's data order

  bool operator==(const file_record&) const = default;
};

/// Who wrote a checkpoint's files: the job (an id made at its first start
/// and kept by every resume), its model (model_digest of the manifest's
/// "model") and the step. The manifest and every layer file record it; a
/// resume refuses a layer file of another job, model or step, and a job
/// saves into, replaces and prunes only its own directories
/// (docs/checkpoints.md, "Hostile directories").
struct checkpoint_identity {
  std::string job_id;       ///< 32 hex digits
  std::string model_digest; ///< hex SHA-256
  std::int64_t step = 0;

  bool operator==(const checkpoint_identity&) const = default;
};

/// A checkpoint's manifest.json: what the job was and which files hold it.
struct checkpoint_manifest {
  int format_version = checkpoint_format_version;
  std::int64_t step = 0;    ///< completed optimizer steps
  std::string job_id;       ///< checkpoint_identity::job_id
  std::string model_digest; ///< model_digest(model)
  nlohmann::json model;     ///< the model's configuration (callers fill)
  nlohmann::json optimizer; ///< optimizer settings and state (callers fill)
  std::uint64_t seed = 0;   ///< the job's seed
  /// Token file path -> hex hash (SHA-256 or CRC), in the callers' order.
  std::vector<std::pair<std::string, std::string>> data_hashes;
  /// Where the training data stands after `step` steps (at_step()):
  /// {"source", "sequences", ...}; empty in checkpoints of older H2s.
  nlohmann::json data;
  std::string plan_json;          ///< the plan that wrote it, as JSON text
  std::string job_toml;           ///< the job file's text
  std::vector<file_record> files; ///< one per layer, by layer index

  bool operator==(const checkpoint_manifest&) const = default;
};

/// The hex SHA-256 of a manifest's "model" (its compact JSON dump).
std::string model_digest(const nlohmann::json& model);

/// The identity a manifest records (its job, model digest and step).
checkpoint_identity identity_of(const checkpoint_manifest& m);

/// A whole checkpoint in host memory.
struct checkpoint {
  std::filesystem::path dir; ///< where it was read from
  checkpoint_manifest manifest;
  std::vector<layer_state> layers; ///< layers[i].layer == i
};

/// "layer-00003.safetensors": the layer index zero-padded to 5 digits.
std::string layer_file_name(int layer);

/// `root`/"step-00000120": the step zero-padded to 8 digits.
std::filesystem::path checkpoint_dir(const std::filesystem::path& root,
                                     std::int64_t step);

/// `root`/"step-00000120.partial-<job id>": where job `job_id` writes the
/// files of a step's checkpoint before publish_checkpoint renames it.
std::filesystem::path partial_checkpoint_dir(const std::filesystem::path& root,
                                             std::int64_t step,
                                             const std::string& job_id);

/// Writes `state` to `dir`/layer_file_name(state.layer), a new file (an
/// entry of that name, a link included, is unlinked first, never written
/// through), recording `id` in its metadata; fsyncs it and returns its record (size,
/// CRC32C of the bytes written, tensors). Crash points "before-layer-file"
/// and "after-layer-file". Invalid tensors are h2::internal_error.
file_record write_layer_file(const std::filesystem::path& dir,
                             const layer_state& state,
                             const checkpoint_identity& id);

/// Writes `dir`/manifest.json atomically: a temporary file in `dir`, fsync,
/// rename, fsync of `dir` (which also makes the layer files' directory
/// entries durable). A checkpoint exists once this returns. Crash points
/// "before-manifest" and "after-manifest-rename". Throws
/// checkpoint_error(io).
void write_manifest(const std::filesystem::path& dir,
                    const checkpoint_manifest& manifest);

/// Makes a fresh partial_checkpoint_dir for `id` and returns it: creates
/// `root` if need be, removes what an abandoned save of the same job and
/// step left there (a link is removed, never followed), then creates the
/// directory itself, durably. Throws checkpoint_error(io).
std::filesystem::path prepare_checkpoint_dir(const std::filesystem::path& root,
                                             const checkpoint_identity& id);

/// Publishes the checkpoint whose layer files are in `partial` (from
/// prepare_checkpoint_dir): writes `manifest` there, then renames the
/// directory to checkpoint_dir(`root`, manifest.step). A directory already
/// there is replaced only when it is this job's checkpoint (its manifest
/// names manifest.job_id); anything else there (another job's, a link, a
/// file) is refused with checkpoint_error(io), and nothing is written
/// outside `root`. Returns the directory.
std::filesystem::path publish_checkpoint(const std::filesystem::path& root,
                                         const std::filesystem::path& partial,
                                         const checkpoint_manifest& manifest);

/// Writes a whole checkpoint of `manifest`'s job: prepare_checkpoint_dir,
/// every layer file, then publish_checkpoint with their records
/// (`manifest.files` is replaced). `layers` must hold layers 0..n-1 (any
/// order). Returns the directory.
std::filesystem::path write_checkpoint(const std::filesystem::path& root,
                                       checkpoint_manifest manifest,
                                       const std::vector<layer_state>& layers);

/// Reads and validates `dir`/manifest.json. Throws checkpoint_error: missing,
/// truncated (the JSON ends early), corrupt (not JSON, manifest_crc32c
/// does not match, a key missing or of the wrong type, file records not
/// naming layers 0..n-1 in order),
/// foreign ("format" is not checkpoint_format), mismatch (another format
/// version).
checkpoint_manifest read_manifest(const std::filesystem::path& dir);

/// What read_manifest does with the text of `file` once read: the same
/// checks and errors (checkpoint_error naming `file`), for text from
/// elsewhere (docs/fuzzing.md).
checkpoint_manifest parse_manifest(std::string_view text,
                                   const std::filesystem::path& file);

/// Reads the layer file `record` of `manifest` describes, checking before
/// allocating: its name, its size against record.bytes, the safetensors
/// header, producer "h2" (else foreign), its layer and the manifest's
/// identity (job, model digest, step) in its metadata (mismatch), the
/// tensors against the record by name (mismatch), then the CRC32C of the
/// whole file (corrupt). The tensors come back in the record's order.
layer_state read_layer_file(const std::filesystem::path& dir,
                            const checkpoint_manifest& manifest,
                            const file_record& record);

/// The manifest and every layer file of `dir`, or a checkpoint_error.
checkpoint read_checkpoint(const std::filesystem::path& dir);

/// Layers [`first`, `end`) of the checkpoint in `dir` whose manifest is
/// `manifest` (read_manifest), each read and checked by read_layer_file:
/// what one chip of a resumed run loads. Throws checkpoint_error, also
/// when the manifest has no such layer.
std::vector<layer_state> read_layers(const std::filesystem::path& dir,
                                     const checkpoint_manifest& manifest,
                                     int first, int end);

/// The newest checkpoint directory under `root` (by step) whose manifest
/// reads and names its step; nullopt if there is none (or no `root`). Each
/// newer directory skipped is reported through `log` (if set) as one line,
/// "h2: skipping incomplete checkpoint <dir>: <why>". Layer files are not
/// read here (read_checkpoint does).
std::optional<std::filesystem::path>
latest_checkpoint(const std::filesystem::path& root,
                  const std::function<void(const std::string&)>& log);

/// Removes all but the newest `keep` (>= 1) complete checkpoints of job
/// `job_id` under `root`, and its partial directories older than the newest
/// (newer ones may still be being written). Directories of other jobs, and
/// step directories without a readable manifest, are never touched, nor
/// are links. Never removes the newest complete checkpoint. Returns the
/// directories removed; throws checkpoint_error(io).
std::vector<std::filesystem::path>
prune_checkpoints(const std::filesystem::path& root, int keep,
                  const std::string& job_id);

/// Test-only crash injection (docs/checkpoints.md): if the environment
/// variable H2_TEST_CRASH_AT equals `point`, the process kills itself with
/// SIGKILL at once. Compiled into every build; costs one getenv.
void crash_point(std::string_view point);

} // namespace h2::runtime
