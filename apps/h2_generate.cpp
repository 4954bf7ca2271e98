// h2-generate: a continuation of a prompt from a checkpoint, on the host
// CPU in fp32, reproducible with a seed (docs/export.md, "Generating").
// Text goes through `h2-data encode` and `h2-data decode`: the tokenizer
// cannot live in a process with libtorch (docs/data.md).
#include "h2/apps/app.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/apps/launcher.hpp"
#include "h2/apps/session.hpp"
#include "h2/core/error.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/generate.hpp"

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

extern char** environ;

namespace {

using namespace h2;
namespace fs = std::filesystem;

struct options {
  std::string checkpoint;
  std::string prompt;
  int tokens = 64;
  runtime::sampling sampling;
  std::string tokenizer; ///< "" : the one the checkpoint's job trained with
};

/// A scratch file removed with this object.
struct scratch_file {
  explicit scratch_file(const std::string& text) {
    char name[] = "/tmp/h2-generate-XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd < 0)
      throw error("cannot create a scratch file in /tmp");
    ::close(fd);
    path = name;
    std::ofstream(path, std::ios::binary) << text;
  }
  ~scratch_file() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  fs::path path;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs `h2-data <verb> --tokenizer MODEL` on `input`; its stdout. Its
/// one-line error (bad input) becomes ours.
std::string h2_data(const std::string& verb, const fs::path& model,
                    const std::string& input) {
  const scratch_file in(input), out(""), err("");
  const auto program = apps::sibling_binary("h2-data");
  std::vector<std::string> args{program, verb, "--tokenizer", model.string()};
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, in.path.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out.path.c_str(),
                                   O_WRONLY | O_TRUNC, 0);
  posix_spawn_file_actions_addopen(&actions, 2, err.path.c_str(),
                                   O_WRONLY | O_TRUNC, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr,
                               argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw error("cannot run " + program + ": " + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
    return read_all(out.path);
  auto why = read_all(err.path);
  why = why.substr(0, why.find('\n'));
  if (const auto at = why.find("error: "); at != std::string::npos)
    why = why.substr(at + 7);
  if (WIFEXITED(status) && WEXITSTATUS(status) == apps::exit_bad_input)
    throw config_error("--tokenizer", "h2-data " + verb + ": " + why);
  throw error("h2-data " + verb + " failed: " + why);
}

/// The tokenizer: --tokenizer, or the shards' of the checkpoint's job when
/// it is the one the checkpoint recorded.
fs::path tokenizer_path(const options& o, const runtime::checkpoint_model& m) {
  if (!o.tokenizer.empty())
    return o.tokenizer;
  std::string why;
  auto path = m.recorded_tokenizer(why);
  if (path.empty())
    throw config_error("--tokenizer", why + ": name a SentencePiece model");
  return path;
}

int run(const options& o) {
  std::error_code ec;
  if (!fs::is_directory(o.checkpoint, ec))
    throw config_error("", o.checkpoint + ": not a checkpoint directory");
  std::unique_ptr<runtime::checkpoint_model> m;
  try {
    m = std::make_unique<runtime::checkpoint_model>(
      runtime::read_checkpoint(o.checkpoint), o.checkpoint);
  } catch (const runtime::checkpoint_error& e) {
    throw config_error("", e.what());
  }
  const auto model = tokenizer_path(o, *m);
  std::vector<std::int32_t> prompt;
  std::istringstream ids(h2_data("encode", model, o.prompt));
  for (long long id; ids >> id;) {
    if (id < 0 || id >= m->config().vocab_size)
      throw config_error("--tokenizer",
                         model.string() + " gives id " + std::to_string(id) +
                           ", outside the model's vocabulary of " +
                           std::to_string(m->config().vocab_size));
    prompt.push_back(static_cast<std::int32_t>(id));
  }
  if (prompt.empty())
    throw config_error("--prompt", "empty: give at least one character");
  const auto out = runtime::generate(*m, prompt, o.tokens, o.sampling);
  std::string text;
  for (auto id : out)
    text += std::to_string(id) + " ";
  std::cout << o.prompt << h2_data("decode", model, text) << std::endl;
  return apps::exit_ok;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App cli{"Print a continuation of a prompt from a checkpoint (host "
               "CPU, fp32; docs/export.md)."};
  cli
    .add_option("checkpoint", o.checkpoint,
                "Checkpoint directory (<checkpoint.dir>/step-NNNNNNNN)")
    ->required();
  cli.add_option("--prompt", o.prompt, "Text to continue")->required();
  cli.add_option("--tokens", o.tokens, "Tokens to generate (default 64)")
    ->check(CLI::Range(1, 1 << 20));
  cli
    .add_option("--temperature", o.sampling.temperature,
                "Softmax temperature (default 0.8; 0: greedy)")
    ->check(CLI::Range(0.0, 100.0));
  cli
    .add_option("--top-k", o.sampling.top_k,
                "Sample among the K likeliest tokens (default 40; 0: all)")
    ->check(CLI::Range(0, 1 << 24));
  cli.add_option("--seed", o.sampling.seed,
                 "Seed of the draws (default 0): the same seed, the same text");
  cli.add_option("--tokenizer", o.tokenizer,
                 "SentencePiece model (default: the one the checkpoint's job "
                 "trained with)");
  return apps::parse_and_run(cli, argc, argv, "h2-generate",
                             [&] { return run(o); });
}
