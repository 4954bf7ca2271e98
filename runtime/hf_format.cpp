#include "h2/runtime/hf_format.hpp"

#include "h2/core/error.hpp"
#include "h2/model/layers.hpp"

#include <ATen/ops/from_blob.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace h2::runtime {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

/// H2's name -> Hugging Face's, for the parts of a name after "blockN."
/// (blocks) or whole (embedding, head); true where GPT-2's Conv1D keeps the
/// weight as [in, out].
struct renaming {
  const char* h2;
  const char* hf;
  bool transposed;
};

constexpr renaming gpt2_names[] = {
  {"embedding.wte", "transformer.wte.weight", false},
  {"embedding.wpe", "transformer.wpe.weight", false},
  {"ln1.weight", "ln_1.weight", false},
  {"ln1.bias", "ln_1.bias", false},
  {"attn.qkv.weight", "attn.c_attn.weight", true},
  {"attn.qkv.bias", "attn.c_attn.bias", false},
  {"attn.proj.weight", "attn.c_proj.weight", true},
  {"attn.proj.bias", "attn.c_proj.bias", false},
  {"ln2.weight", "ln_2.weight", false},
  {"ln2.bias", "ln_2.bias", false},
  {"mlp.fc1.weight", "mlp.c_fc.weight", true},
  {"mlp.fc1.bias", "mlp.c_fc.bias", false},
  {"mlp.fc2.weight", "mlp.c_proj.weight", true},
  {"mlp.fc2.bias", "mlp.c_proj.bias", false},
  {"head.ln_f.weight", "transformer.ln_f.weight", false},
  {"head.ln_f.bias", "transformer.ln_f.bias", false},
  {"head.lm_head.weight", "lm_head.weight", false},
};

constexpr renaming llama_names[] = {
  {"embedding.wte", "model.embed_tokens.weight", false},
  {"attn_norm.weight", "input_layernorm.weight", false},
  {"attn.q.weight", "self_attn.q_proj.weight", false},
  {"attn.k.weight", "self_attn.k_proj.weight", false},
  {"attn.v.weight", "self_attn.v_proj.weight", false},
  {"attn.o.weight", "self_attn.o_proj.weight", false},
  {"mlp_norm.weight", "post_attention_layernorm.weight", false},
  {"mlp.gate.weight", "mlp.gate_proj.weight", false},
  {"mlp.up.weight", "mlp.up_proj.weight", false},
  {"mlp.down.weight", "mlp.down_proj.weight", false},
  {"head.norm.weight", "model.norm.weight", false},
  {"head.lm_head.weight", "lm_head.weight", false},
};

std::span<const renaming> names_of(const gpt_config& cfg) {
  if (cfg.family == model_family::llama)
    return llama_names;
  return gpt2_names;
}

/// [rows, cols] -> [cols, rows].
std::vector<float> transpose(const std::vector<float>& v, std::int64_t rows,
                             std::int64_t cols) {
  std::vector<float> out(v.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      out[static_cast<std::size_t>(c * rows + r)] =
        v[static_cast<std::size_t>(r * cols + c)];
  return out;
}

} // namespace

hf_tensor_name hf_name_of(const gpt_config& cfg, const std::string& h2_name) {
  std::string prefix, rest = h2_name;
  if (h2_name.starts_with("block")) {
    const auto dot = h2_name.find('.');
    H2_ENFORCE(dot != std::string::npos, "parameter ", h2_name);
    const int block = std::stoi(h2_name.substr(5, dot - 5));
    const auto hf_block = std::to_string(block - 1);
    prefix = cfg.family == model_family::llama
               ? "model.layers." + hf_block + "."
               : "transformer.h." + hf_block + ".";
    rest = h2_name.substr(dot + 1);
  }
  for (const auto& r : names_of(cfg))
    if (rest == r.h2)
      return {prefix + r.hf, r.transposed};
  throw internal_error("no Hugging Face name for " + h2_name);
}

std::vector<parameter_values>
to_hf_tensors(const gpt_config& cfg,
              const std::vector<parameter_values>& weights) {
  std::vector<parameter_values> out;
  for (const auto& w : weights) {
    // Tied: Hugging Face ties lm_head to the embedding when it loads.
    if (cfg.tie_embeddings && w.name == "head.lm_head.weight")
      continue;
    const auto n = hf_name_of(cfg, w.name);
    parameter_values p{n.name, w.shape, w.values, w.layer};
    if (n.transposed) {
      H2_ENFORCE(w.shape.size() == 2, w.name, " is not a matrix");
      p.values = transpose(w.values, w.shape[0], w.shape[1]);
      p.shape = {w.shape[1], w.shape[0]};
    }
    out.push_back(std::move(p));
  }
  return out;
}

json hf_config(const gpt_config& g, int bos_id, int eos_id) {
  json j;
  if (g.family == model_family::llama) {
    j = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"hidden_size", g.d_model},
         {"intermediate_size", g.d_ff},
         {"num_attention_heads", g.n_head},
         {"num_key_value_heads", g.kv_heads()},
         {"head_dim", g.head_dim()},
         {"num_hidden_layers", g.n_layer},
         {"vocab_size", g.vocab_size},
         {"max_position_embeddings", g.seq_len},
         {"rms_norm_eps", g.norm_eps},
         {"rope_theta", g.rope_theta},
         {"rope_scaling", nullptr},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"mlp_bias", false},
         {"attention_dropout", 0.0},
         {"initializer_range", 0.02}};
  } else {
    j = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"n_embd", g.d_model},
         {"n_inner", g.d_ff},
         {"n_head", g.n_head},
         {"n_layer", g.n_layer},
         {"vocab_size", g.vocab_size},
         {"n_positions", g.seq_len},
         {"n_ctx", g.seq_len},
         {"layer_norm_epsilon", g.norm_eps},
         {"activation_function", "gelu"},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"scale_attn_weights", true},
         {"initializer_range", 0.02}};
  }
  j["tie_word_embeddings"] = g.tie_embeddings;
  j["torch_dtype"] = "float32";
  j["transformers_version"] = "4.40.0";
  j["producer"] = "h2";
  if (bos_id >= 0)
    j["bos_token_id"] = bos_id;
  if (eos_id >= 0)
    j["eos_token_id"] = eos_id;
  return j;
}

namespace {

json read_json(const fs::path& path, const std::string& key) {
  std::ifstream in(path);
  if (!in)
    throw config_error(key, path.string() + ": cannot read (a Hugging Face "
                                            "model directory holds "
                                            "config.json)");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw config_error(key, path.string() + ": not JSON: " + e.what());
  }
}

/// Checks config.json against the job's model; throws naming both keys.
void check_config(const json& j, const gpt_config& g, const fs::path& path,
                  const std::string& key) {
  auto bad = [&](const std::string& why) {
    return config_error(key, path.string() + ": " + why);
  };
  const bool llama = g.family == model_family::llama;
  const std::string type = j.value("model_type", "");
  if (type != (llama ? "llama" : "gpt2"))
    throw bad("model_type is \"" + type + "\", the job's model.family \"" +
              std::string(to_string(g.family)) + "\" needs \"" +
              (llama ? "llama" : "gpt2") + "\"");
  auto same = [&](const char* hf_key, double expected, const char* h2_key,
                  std::optional<double> fallback = std::nullopt) {
    double value = 0;
    if (j.contains(hf_key) && j.at(hf_key).is_number())
      value = j.at(hf_key).get<double>();
    else if (fallback)
      value = *fallback;
    else
      throw bad(std::string(hf_key) + " is missing");
    if (value != expected) {
      std::ostringstream msg;
      msg << hf_key << " is " << value << ", the job's " << h2_key << " "
          << expected;
      throw bad(msg.str());
    }
  };
  auto at_least = [&](const char* hf_key, double needed, const char* h2_key) {
    const double value = j.value(hf_key, 0.0);
    if (value < needed) {
      std::ostringstream msg;
      msg << hf_key << " is " << value << ", fewer than the job's " << h2_key
          << " " << needed;
      throw bad(msg.str());
    }
  };
  same("vocab_size", g.vocab_size, "model.vocab_size");
  if (llama) {
    same("hidden_size", g.d_model, "model.d_model");
    same("intermediate_size", g.d_ff, "model.d_ff");
    same("num_attention_heads", g.n_head, "model.n_head");
    same("num_key_value_heads", g.kv_heads(), "model.n_kv_head", g.n_head);
    same("num_hidden_layers", g.n_layer, "model.n_layer");
    same("rms_norm_eps", g.norm_eps, "model.norm_eps");
    same("rope_theta", g.rope_theta, "model.rope_theta", 10000.0);
    same("head_dim", g.head_dim(), "model.d_model / model.n_head",
         g.head_dim());
    if (j.value("hidden_act", "silu") != "silu")
      throw bad("hidden_act is not silu (H2's SwiGLU)");
    if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null())
      throw bad("rope_scaling is set: H2's rotary embedding is unscaled");
    if (j.value("attention_bias", false) || j.value("mlp_bias", false))
      throw bad("attention_bias or mlp_bias is set: H2's llama has no biases");
  } else {
    same("n_embd", g.d_model, "model.d_model");
    same("n_head", g.n_head, "model.n_head");
    same("n_layer", g.n_layer, "model.n_layer");
    const auto inner = j.contains("n_inner") && j.at("n_inner").is_number()
                         ? j.at("n_inner").get<double>()
                         : 4.0 * g.d_model;
    if (inner != g.d_ff)
      throw bad("n_inner is " + std::to_string(static_cast<long long>(inner)) +
                ", the job's model.d_ff " + std::to_string(g.d_ff));
    same("layer_norm_epsilon", g.norm_eps, "model.norm_eps");
    const std::string act = j.value("activation_function", "gelu_new");
    if (act != "gelu")
      throw bad("activation_function is \"" + act +
                "\": H2's gpt2 computes the exact GELU (\"gelu\")");
  }
  at_least(llama ? "max_position_embeddings" : "n_positions", g.seq_len,
           "model.seq_len");
}

/// Every tensor of the model's safetensors file(s), by name.
std::map<std::string, state_tensor> read_weights(const fs::path& dir,
                                                 const std::string& key) {
  std::vector<fs::path> files;
  const auto index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const auto j = read_json(index, key);
    std::set<std::string> names;
    if (!j.contains("weight_map") || !j.at("weight_map").is_object())
      throw config_error(key, index.string() + ": no weight_map");
    for (const auto& [tensor, file] : j.at("weight_map").items()) {
      const auto name = file.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "..")
        throw config_error(key, index.string() + ": \"" + name +
                                  "\" is not a file of the directory");
      names.insert(name);
    }
    for (const auto& n : names)
      files.push_back(dir / n);
  } else {
    files.push_back(dir / "model.safetensors");
  }
  std::map<std::string, state_tensor> out;
  for (const auto& f : files) {
    try {
      safetensors_reader reader(f);
      std::uint32_t crc = 0;
      for (auto& t : reader.read_tensors(crc))
        out[t.name] = std::move(t);
    } catch (const checkpoint_error& e) {
      throw config_error(key, e.what());
    }
  }
  return out;
}

/// `t`'s elements as fp32.
std::vector<float> as_f32(const state_tensor& t, const fs::path& dir,
                          const std::string& key) {
  std::int64_t n = 1;
  for (auto d : t.shape)
    n *= d;
  std::vector<float> out(static_cast<std::size_t>(n));
  if (t.dtype == "F32") {
    std::memcpy(out.data(), t.bytes.data(), out.size() * sizeof(float));
    return out;
  }
  const auto type = t.dtype == "BF16"  ? at::kBFloat16
                    : t.dtype == "F16" ? at::kHalf
                                       : at::ScalarType::Undefined;
  if (type == at::ScalarType::Undefined)
    throw config_error(key, (dir / t.name).string() + ": dtype " + t.dtype +
                              " (H2 reads F32, BF16 and F16 weights)");
  const auto wide = at::from_blob(const_cast<std::uint8_t*>(t.bytes.data()),
                                  {n}, at::TensorOptions(type))
                      .to(at::kFloat)
                      .contiguous();
  std::memcpy(out.data(), wide.data_ptr<float>(), out.size() * sizeof(float));
  return out;
}

} // namespace

std::vector<layer_state> read_hf_model(const fs::path& dir,
                                       const gpt_config& cfg,
                                       const std::string& key) {
  const auto config_path = dir / "config.json";
  const auto config = read_json(config_path, key);
  check_config(config, cfg, config_path, key);
  const bool tied = config.value("tie_word_embeddings", true);
  if (cfg.tie_embeddings && !tied)
    throw config_error(key, config_path.string() +
                              ": tie_word_embeddings is false, the job's "
                              "model.tie_embeddings true");
  auto weights = read_weights(dir, key);
  std::vector<layer_state> out;
  for (int l = 0; l < cfg.num_layers(); ++l) {
    // The layer's parameter names and shapes, from the model itself.
    const auto layer = model::make_layer(cfg, l, 0);
    layer_state s;
    s.layer = l;
    for (const auto& p : layer->parameters()) {
      const auto hf = hf_name_of(cfg, p.name);
      // A tied head is the embedding (a job with tied embeddings keeps its
      // two copies equal from the start).
      const bool head = p.name == "head.lm_head.weight";
      auto it =
        head && cfg.tie_embeddings ? weights.end() : weights.find(hf.name);
      if (it == weights.end() && head && tied)
        it = weights.find(hf_name_of(cfg, "embedding.wte").name);
      if (it == weights.end())
        throw config_error(key, dir.string() + ": no tensor " + hf.name +
                                  " (H2's " + p.name + ")");
      const auto& t = it->second;
      auto values = as_f32(t, dir, key);
      std::vector<std::int64_t> shape = t.shape;
      if (hf.transposed && shape.size() == 2) {
        values = transpose(values, shape[0], shape[1]);
        shape = {shape[1], shape[0]};
      }
      const auto want = p.value.sizes().vec();
      // Learned positions: the first seq_len of the model's n_positions.
      if (p.name == "embedding.wpe" && shape.size() == 2 &&
          shape[0] > want[0] && shape[1] == want[1]) {
        values.resize(static_cast<std::size_t>(want[0] * want[1]));
        shape = want;
      }
      if (shape != want) {
        std::ostringstream msg;
        msg << dir.string() << ": " << hf.name << " has shape [";
        for (std::size_t i = 0; i < t.shape.size(); ++i)
          msg << (i ? ", " : "") << t.shape[i];
        msg << "], H2's " << p.name << " needs its layout of [";
        for (std::size_t i = 0; i < want.size(); ++i)
          msg << (i ? ", " : "") << want[i];
        msg << "]";
        throw config_error(key, msg.str());
      }
      s.tensors.push_back(f32_tensor(p.name, shape, values));
    }
    out.push_back(std::move(s));
  }
  return out;
}

} // namespace h2::runtime
