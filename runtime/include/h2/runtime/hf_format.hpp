// Hugging Face's layout of H2's models (docs/export.md, "Hugging Face"):
// LlamaForCausalLM for the llama family, GPT2LMHeadModel for gpt2. The
// name and layout of every tensor both ways, the config.json, and reading
// such a directory back into per-layer state (h2-launch --init-from).
#pragma once

#include "h2/core/model_config.hpp"
#include "h2/runtime/reports.hpp"
#include "h2/runtime/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace h2::runtime {

/// Where an H2 parameter lives in a Hugging Face model.
struct hf_tensor_name {
  std::string name;        ///< "model.layers.0.self_attn.q_proj.weight"
  bool transposed = false; ///< GPT-2's Conv1D weights: [in, out]
};

/// The Hugging Face name of H2 parameter `h2_name` of `cfg`. Throws
/// internal_error for a name H2 does not have.
hf_tensor_name hf_name_of(const gpt_config& cfg, const std::string& h2_name);

/// `weights` (H2's names and layouts, as checkpoint_model::weights gives
/// them) under Hugging Face's names and layouts, in the same order; a tied
/// head's copy is left out (Hugging Face ties it when it loads).
std::vector<parameter_values>
to_hf_tensors(const gpt_config& cfg,
              const std::vector<parameter_values>& weights);

/// config.json of a Hugging Face model directory for `cfg` (fp32 weights,
/// tie_word_embeddings as the model; `eos_id` and `bos_id` of the
/// tokenizer, -1 without).
nlohmann::json hf_config(const gpt_config& cfg, int bos_id, int eos_id);

/// Reads a Hugging Face model directory (config.json and model.safetensors,
/// or the shards model.safetensors.index.json lists; F32, BF16 or F16) as
/// per-layer state for `cfg`: parameters only, no AdamW moments (the state
/// before the first update). A model whose lm_head is tied (absent) gets
/// the token embedding as H2's head weight; a job with tied embeddings
/// needs a tied model. Throws config_error naming `key` and the file or
/// config key when the directory is not such a model or its shapes are not
/// `cfg`'s ("config.json: hidden_size is 64, the job's model.d_model 32").
std::vector<layer_state> read_hf_model(const std::filesystem::path& dir,
                                       const gpt_config& cfg,
                                       const std::string& key);

} // namespace h2::runtime
