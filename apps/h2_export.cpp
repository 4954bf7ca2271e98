// h2-export: a checkpoint's model weights as one safetensors file plus the
// model's configuration as JSON, for PyTorch and other frameworks; and,
// test-only, the logits of H2's own forward pass on a batch of token ids.
// docs/export.md.
#include "h2/apps/app.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/apps/session.hpp"
#include "h2/core/error.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/export.hpp"
#include "h2/runtime/hf_format.hpp"

#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

using namespace h2;
namespace fs = std::filesystem;

// The token and logits files are raw little-endian (docs/export.md).
static_assert(std::endian::native == std::endian::little,
              "h2-export reads and writes little-endian files as memory");

/// Largest logits output of --logits, in bytes: a test path, not a server.
constexpr std::uint64_t max_logits_bytes = 1ull << 30;

struct options {
  std::string checkpoint;
  std::string out;
  std::string format = "h2"; ///< "h2" or "hf"
  std::string tokens;        ///< --logits: the token file ("" without)
};

/// The checkpoint in `dir` as a model. A checkpoint that is missing,
/// damaged or not H2's is bad input (exit 2), named by its file.
std::unique_ptr<runtime::checkpoint_model> load(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw config_error("", dir.string() + ": no such checkpoint directory");
  if (!fs::is_directory(dir, ec))
    throw config_error("", dir.string() +
                             ": not a directory (a checkpoint is a "
                             "step-NNNNNNNN directory holding manifest.json)");
  try {
    return std::make_unique<runtime::checkpoint_model>(
      runtime::read_checkpoint(dir), dir);
  } catch (const runtime::checkpoint_error& e) {
    // A checkpoint.dir given for one of its checkpoints: say which to pass.
    if (e.kind() == runtime::checkpoint_errc::missing &&
        e.file() == dir / runtime::manifest_file_name)
      if (auto newest = runtime::latest_checkpoint(dir, nullptr))
        throw config_error("", std::string(e.what()) +
                                 " (a directory of checkpoints: export one "
                                 "of them, the newest is " +
                                 newest->string() + ")");
    throw config_error("", e.what());
  }
}

/// The token ids of `path`: int32 little-endian, whole sequences of the
/// model's seq_len, each in [0, vocab_size). Anything else is bad input.
std::vector<std::int32_t> read_tokens(const std::string& path,
                                      const gpt_config& g) {
  std::error_code ec;
  const auto bytes = fs::file_size(path, ec);
  if (ec)
    throw config_error("--logits",
                       path + ": cannot read the token file: " + ec.message());
  const std::uint64_t sequence_bytes =
    static_cast<std::uint64_t>(g.seq_len) * sizeof(std::int32_t);
  if (bytes == 0 || bytes % sequence_bytes != 0)
    throw config_error("--logits",
                       path + ": " + std::to_string(bytes) +
                         " bytes are not whole sequences of seq_len " +
                         std::to_string(g.seq_len) +
                         " int32 token ids (a multiple of " +
                         std::to_string(sequence_bytes) + " bytes)");
  const std::uint64_t count = bytes / sizeof(std::int32_t);
  if (count * g.vocab_size * sizeof(float) > max_logits_bytes)
    throw config_error("--logits", path + ": " + std::to_string(count) +
                                     " tokens would make more than 1 GiB "
                                     "of logits (a test path: use fewer)");
  std::vector<std::int32_t> tokens(count);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(tokens.data()),
               static_cast<std::streamsize>(bytes)))
    throw config_error("--logits", path + ": cannot read the token file");
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= g.vocab_size)
      throw config_error("--logits",
                         path + ": token id " + std::to_string(tokens[i]) +
                           " at sequence " + std::to_string(i / g.seq_len) +
                           ", position " + std::to_string(i % g.seq_len) +
                           " is outside the vocabulary [0, " +
                           std::to_string(g.vocab_size) + ")");
  return tokens;
}

/// Writes `bytes` to `path` (created or replaced); h2::error when it cannot.
void write_bytes(const fs::path& path, std::span<const char> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out)
    throw error(path.string() + ": cannot write: " + std::strerror(errno));
}

/// OUT with its last extension replaced by ".config.json", "model.config.json"
/// for "model.safetensors" (docs/export.md).
fs::path config_path_of(const fs::path& out) {
  return fs::path(out).replace_extension(".config.json");
}

int export_weights(const runtime::checkpoint_model& m, const fs::path& out) {
  const auto config_path = config_path_of(out);
  const auto weights = m.weights();
  apps::write_safetensors(out.string(), weights, m.job_name());
  const std::string config =
    runtime::export_config(m, out.filename().string()).dump(2) + "\n";
  write_bytes(config_path, config);
  std::int64_t parameters = 0;
  for (const auto& w : weights)
    parameters += static_cast<std::int64_t>(w.values.size());
  std::cout << "h2-export: step " << m.step() << " of job \"" << m.job_name()
            << "\": " << parameters << " parameters in " << weights.size()
            << " tensors written to " << out.string() << ", config to "
            << config_path.string() << std::endl;
  return apps::exit_ok;
}

/// OUT as a Hugging Face model directory (docs/export.md, "Hugging Face").
int export_hf(const runtime::checkpoint_model& m, const fs::path& out) {
  std::error_code ec;
  if (fs::exists(out, ec) &&
      !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
    throw config_error("out",
                       out.string() + ": exists and is not an empty directory");
  fs::create_directories(out, ec);
  if (ec)
    throw config_error("out",
                       out.string() + ": cannot create: " + ec.message());
  const auto& g = m.config();
  const auto tensors = runtime::to_hf_tensors(g, m.weights());
  apps::write_safetensors((out / "model.safetensors").string(), tensors,
                          m.job_name());
  std::string why;
  const auto tokenizer = m.recorded_tokenizer(why);
  const int bos = tokenizer.empty() ? -1 : 1, eos = tokenizer.empty() ? -1 : 2;
  write_bytes(out / "config.json",
              runtime::hf_config(g, bos, eos).dump(2) + "\n");
  if (!tokenizer.empty()) {
    fs::copy_file(tokenizer, out / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    const nlohmann::json tc = {{"tokenizer_class", "LlamaTokenizer"},
                               {"model_max_length", g.seq_len},
                               {"bos_token", "<s>"},
                               {"eos_token", "</s>"},
                               {"unk_token", "<unk>"},
                               {"add_bos_token", false},
                               {"add_eos_token", false},
                               {"legacy", true}};
    write_bytes(out / "tokenizer_config.json", tc.dump(2) + "\n");
  }
  std::cout << "h2-export: step " << m.step() << " of job \"" << m.job_name()
            << "\" as "
            << (g.family == model_family::llama ? "LlamaForCausalLM"
                                                : "GPT2LMHeadModel")
            << ": " << tensors.size() << " tensors, config.json"
            << (tokenizer.empty() ? " (no tokenizer: " + why + ")"
                                  : ", tokenizer.model")
            << " in " << out.string() << std::endl;
  return apps::exit_ok;
}

int export_logits(const runtime::checkpoint_model& m,
                  const std::string& tokens_path, const fs::path& out) {
  const auto& g = m.config();
  const auto tokens = read_tokens(tokens_path, g);
  const auto logits = m.logits(tokens);
  write_bytes(out, {reinterpret_cast<const char*>(logits.data()),
                    logits.size() * sizeof(float)});
  std::cout << "h2-export: logits [" << tokens.size() / g.seq_len << ", "
            << g.seq_len << ", " << g.vocab_size << "] (float32) of step "
            << m.step() << " written to " << out.string() << std::endl;
  return apps::exit_ok;
}

int run(const options& o) {
  const auto model = load(o.checkpoint);
  if (!o.tokens.empty())
    return export_logits(*model, o.tokens, o.out);
  if (o.format == "hf")
    return export_hf(*model, o.out);
  return export_weights(*model, o.out);
}

} // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App cli{"Export a checkpoint's model weights (no optimizer state) as "
               "one safetensors file, with the model's configuration beside "
               "it as OUT.config.json (docs/export.md)."};
  cli
    .add_option("checkpoint", o.checkpoint,
                "Checkpoint directory (<checkpoint.dir>/step-NNNNNNNN)")
    ->required();
  cli
    .add_option("out", o.out,
                "Output: the weights (OUT.safetensors; the config goes to "
                "OUT.config.json), or with --logits the logits")
    ->required();
  cli
    .add_option("--format", o.format,
                "h2 (default): OUT.safetensors under H2's names plus "
                "OUT.config.json; hf: OUT is a Hugging Face model directory "
                "(config.json, model.safetensors, tokenizer.model)")
    ->check(CLI::IsMember({"h2", "hf"}));
  cli.add_option("--logits", o.tokens,
                 "Test only: run H2's forward pass (fp32, CPU) on the token "
                 "ids in FILE (int32 little-endian [batch, seq_len]) and write "
                 "the logits to OUT (float32 little-endian [batch, seq_len, "
                 "vocab]) instead of exporting");
  return apps::parse_and_run(cli, argc, argv, "h2-export",
                             [&] { return run(o); });
}
