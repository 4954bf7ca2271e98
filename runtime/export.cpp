// A checkpoint's model for other frameworks (docs/export.md).
#include "h2/runtime/export.hpp"

#include "h2/core/error.hpp"
#include "h2/core/job.hpp"
#include "h2/corpus/shards.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/layers.hpp"
#include "h2/runtime/checkpointing.hpp"
#include "h2/runtime/stage_state.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>

#include <cstring>

namespace h2::runtime {

namespace {

/// The job the manifest records, or checkpoint_error(corrupt) naming it.
job_config recorded_job(const checkpoint_manifest& manifest,
                        const std::filesystem::path& manifest_path) {
  try {
    return parse_job(manifest.job_toml, "job_toml");
  } catch (const config_error& e) {
    throw checkpoint_error(checkpoint_errc::corrupt, manifest_path,
                           std::string("the job it records does not parse: ") +
                             e.what());
  }
}

/// `e`'s message without the "<kind>: " its what() starts with (an error
/// that names no file).
std::string message_of(const checkpoint_error& e) {
  std::string what = e.what();
  const std::string prefix = std::string(to_string(e.kind())) + ": ";
  return what.starts_with(prefix) ? what.substr(prefix.size()) : what;
}

} // namespace

checkpoint_model::checkpoint_model(const checkpoint& c,
                                   const std::filesystem::path& dir)
    : step_(c.manifest.step) {
  const auto manifest_path = dir / manifest_file_name;
  const job_config job = recorded_job(c.manifest, manifest_path);
  job_name_ = job.name;
  config_ = job.model;
  data_ = job.data;
  for (const auto& [path, hash] : c.manifest.data_hashes)
    if (path == tokenizer_hash_key)
      tokenizer_ = hash;
  if (static_cast<int>(c.layers.size()) != config_.num_layers() ||
      c.manifest.files.size() != c.layers.size())
    throw checkpoint_error(
      checkpoint_errc::mismatch, manifest_path,
      std::to_string(c.layers.size()) + " layer files for a model of " +
        std::to_string(config_.num_layers()) + " layers (its job_toml)");
  // Exports compute on the host.
  const auto host = devices::make_host_device();
  devices::thread_binding bind(*host);
  for (std::size_t i = 0; i < c.layers.size(); ++i) {
    auto l = model::make_layer(config_, static_cast<int>(i), c.manifest.seed,
                               host->torch_device());
    try {
      restore_layer(*host, *l, c.layers[i]);
    } catch (const checkpoint_error& e) {
      // restore_layer names the layer, not its file.
      throw checkpoint_error(e.kind(), dir / c.manifest.files[i].file,
                             message_of(e));
    }
    layers_.push_back(std::move(l));
  }
}

checkpoint_model::~checkpoint_model() = default;

std::filesystem::path
checkpoint_model::recorded_tokenizer(std::string& why) const {
  if (tokenizer_.empty()) {
    why = "the checkpoint's job did not train on token shards";
    return {};
  }
  const auto path =
    std::filesystem::path(data_.shards_dir) / corpus::shard_tokenizer_file;
  const auto hash = corpus::file_sha256(path);
  if (!hash) {
    why = path.string() + " cannot be read";
    return {};
  }
  if (*hash != tokenizer_) {
    why = path.string() + " is not the tokenizer the checkpoint recorded (" +
          tokenizer_ + ")";
    return {};
  }
  return path;
}

std::vector<parameter_values> checkpoint_model::weights() const {
  std::vector<parameter_values> out;
  for (const auto& l : layers_)
    for (const auto& p : l->parameters()) {
      const auto t = p.value.detach().contiguous();
      const float* data = t.data_ptr<float>();
      out.push_back(
        {p.name, t.sizes().vec(), std::vector<float>(data, data + t.numel())});
    }
  return out;
}

at::Tensor
checkpoint_model::forward_logits(std::span<const std::int32_t> tokens,
                                 std::int64_t b) const {
  for (auto id : tokens)
    H2_ENFORCE(id >= 0 && id < config_.vocab_size, "token id ", id,
               " outside the vocabulary of ", config_.vocab_size);
  const std::int64_t t = static_cast<std::int64_t>(tokens.size()) / b;
  at::NoGradGuard no_grad;
  model::micro_batch mb;
  mb.tokens = at::from_blob(const_cast<std::int32_t*>(tokens.data()), {b, t},
                            at::TensorOptions(at::kInt))
                .to(at::kLong);
  // The embedding ignores its input; the head's loss is not wanted: the
  // blocks' output goes to the head's logits instead.
  at::Tensor x;
  for (std::size_t i = 0; i + 1 < layers_.size(); ++i)
    x = layers_[i]->forward(x, mb);
  return model::head_logits(*layers_.back(), x).to(at::kFloat).contiguous();
}

std::vector<float>
checkpoint_model::logits(std::span<const std::int32_t> tokens) const {
  const std::int64_t t = config_.seq_len;
  H2_ENFORCE(!tokens.empty() && tokens.size() % t == 0, tokens.size(),
             " tokens are not whole sequences of ", t);
  const auto out =
    forward_logits(tokens, static_cast<std::int64_t>(tokens.size()) / t);
  const float* data = out.data_ptr<float>();
  return {data, data + out.numel()};
}

std::vector<float>
checkpoint_model::last_logits(std::span<const std::int32_t> tokens) const {
  H2_ENFORCE(!tokens.empty() &&
               tokens.size() <= static_cast<std::size_t>(config_.seq_len),
             tokens.size(), " tokens for a context of ", config_.seq_len);
  const auto out = forward_logits(tokens, 1);
  const float* last =
    out.data_ptr<float>() +
    (static_cast<std::int64_t>(tokens.size()) - 1) * config_.vocab_size;
  return {last, last + config_.vocab_size};
}

nlohmann::json export_config(const checkpoint_model& m,
                             const std::string& weights_file) {
  const auto& g = m.config();
  const bool llama = g.family == model_family::llama;
  nlohmann::json j = {
    {"format", "h2-export"},
    {"format_version", 1},
    {"producer", "h2"},
    {"job", m.job_name()},
    {"step", m.step()},
    {"weights", weights_file},
    {"dtype", "float32"},
    {"architecture", llama ? "llama" : "gpt"},
    {"family", to_string(g.family)},
    {"vocab_size", g.vocab_size},
    {"seq_len", g.seq_len},
    {"d_model", g.d_model},
    {"n_head", g.n_head},
    {"n_kv_head", g.kv_heads()},
    {"head_dim", g.head_dim()},
    {"n_layer", g.n_layer},
    {"d_ff", g.d_ff},
    {"parameters", model_parameters(g)},
    {"tied_embeddings", g.tie_embeddings},
    {"position_embedding", llama ? "rotary" : "learned"},
    {"norm", "pre"},
    {llama ? "rms_norm_eps" : "layer_norm_eps", g.norm_eps},
    {"bias", !llama},
    {"lm_head_bias", false},
    {"activation", llama ? "swiglu" : "gelu"},
    {"attention", "causal"},
    {"dropout", 0.0},
  };
  if (llama) {
    j["rope_theta"] = g.rope_theta;
    j["rope_layout"] = "rotate_half";
  } else {
    j["gelu_approximate"] = "none";
  }
  return j;
}

} // namespace h2::runtime
