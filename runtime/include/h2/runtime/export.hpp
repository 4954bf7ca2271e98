// A checkpoint's model for other frameworks (docs/export.md): its weights
// without the optimizer's state, the configuration a PyTorch GPT needs to
// use them, and, for tests, the logits of H2's own forward pass. No actors;
// libtorch stays behind this header.
#pragma once

#include "h2/core/job.hpp"
#include "h2/core/model_config.hpp"
#include "h2/model/fwd.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/reports.hpp"

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace h2::runtime {

/// A checkpoint's GPT in host memory: every global layer built by model/
/// (fp32, on the CPU, on the calling thread) from the job its manifest
/// records, and loaded with the checkpoint's state (restore_layer). The
/// AdamW moments are checked with the weights but not used. Not
/// thread-safe.
class checkpoint_model {
public:
  /// `dir` is where `c` was read from; errors name its files. Throws
  /// checkpoint_error: `corrupt` naming manifest.json when the job text it
  /// records does not parse, `mismatch` naming manifest.json when the
  /// number of layers is not the model's, or naming a layer file whose
  /// tensors are not the model's layer's (names, shapes, dtypes).
  checkpoint_model(const checkpoint& c, const std::filesystem::path& dir);
  ~checkpoint_model();

  checkpoint_model(const checkpoint_model&) = delete;
  checkpoint_model& operator=(const checkpoint_model&) = delete;

  /// The job's name ([job] name of the job that wrote the checkpoint).
  const std::string& job_name() const noexcept { return job_name_; }
  /// The GPT's shape, from the job the manifest records.
  const gpt_config& config() const noexcept { return config_; }
  /// Completed optimizer steps of the checkpoint.
  std::int64_t step() const noexcept { return step_; }
  /// The job's [data]: where its tokenizer is, for token shards.
  const data_config& data() const noexcept { return data_; }
  /// The tokenizer hash the checkpoint recorded ("" without shards).
  const std::string& tokenizer_hash() const noexcept { return tokenizer_; }
  /// The tokenizer the job trained with: its shard directory's, when that
  /// file still is the one the checkpoint recorded; else empty, and `why`
  /// says why not.
  std::filesystem::path recorded_tokenizer(std::string& why) const;

  /// The weights under H2's parameter names, global layer by layer and in
  /// each layer's order: the names, order and values h2-launch --export
  /// writes for the same weights.
  std::vector<parameter_values> weights() const;

  /// H2's forward pass, fp32 on the CPU, of `tokens`: sequences of
  /// config().seq_len token ids one after the other (so its size is a
  /// positive multiple of seq_len), each in [0, vocab_size). User input is
  /// the caller's to check; a violation here is h2::internal_error.
  /// Returns the logits [sequences, seq_len, vocab_size], row-major.
  std::vector<float> logits(std::span<const std::int32_t> tokens) const;

  /// The logits [vocab_size] at the last position of one sequence of
  /// `tokens` (1 to seq_len ids in [0, vocab_size)): what generation draws
  /// the next token from. A violation is h2::internal_error.
  std::vector<float> last_logits(std::span<const std::int32_t> tokens) const;

private:
  /// The head's logits of `b` sequences of `tokens.size() / b` ids.
  at::Tensor forward_logits(std::span<const std::int32_t> tokens,
                            std::int64_t b) const;

  std::string job_name_;
  gpt_config config_;
  data_config data_;
  std::string tokenizer_;
  std::int64_t step_ = 0;
  std::vector<std::unique_ptr<model::layer>> layers_;
};

/// The export's model configuration (docs/export.md, "The config file"):
/// the GPT's shape and what its layers compute, the step, the dtype of the
/// weights, and `weights_file`, the name of the safetensors file it
/// describes. Keys sorted (nlohmann::json's default).
nlohmann::json export_config(const checkpoint_model& m,
                             const std::string& weights_file);

} // namespace h2::runtime
