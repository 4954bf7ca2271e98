// h2-data: text to token shards and back (docs/data.md).
//   h2-data tokenize --input PATH... (--vocab-size N | --tokenizer MODEL)
//                    --out DIR
//   h2-data inspect DIR
//   h2-data encode|decode --tokenizer MODEL   (stdin -> stdout)
#include "h2/apps/cli.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/core/error.hpp"
#include "h2/corpus/encode.hpp"

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <thread>

namespace {

using namespace h2;
namespace fs = std::filesystem;

struct tokenize_options {
  std::vector<std::string> inputs;
  std::string out;
  int vocab_size = 0;
  std::string model_type = "bpe";
  std::string tokenizer;
  std::uint64_t shard_tokens = std::uint64_t{1} << 27;
  std::int64_t max_sentences = 2'000'000;
  int threads = 0;
  bool quiet = false;
};

struct inspect_options {
  std::string dir;
  int windows = 3;
  int window_tokens = 48;
};

/// Progress on stderr: a bar redrawn in place on a terminal, a line per
/// quarter otherwise.
class progress_bar {
public:
  explicit progress_bar(bool quiet)
      : quiet_(quiet), tty_(::isatty(STDERR_FILENO) == 1) {}

  void operator()(std::string_view phase, std::uint64_t done,
                  std::uint64_t total) {
    if (quiet_)
      return;
    const auto now = std::chrono::steady_clock::now();
    if (phase != phase_) {
      phase_ = phase;
      start_ = now;
      quarter_ = -1;
    }
    const double f = total ? static_cast<double>(done) / total : 1.0;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double mb = static_cast<double>(done) / 1e6;
    char line[160];
    if (tty_) {
      const int filled = static_cast<int>(f * 30);
      std::snprintf(line, sizeof line,
                    "\rh2-data: %-9s [%-30s] %5.1f%% %9.1f MB %6.1f MB/s",
                    phase_.c_str(), std::string(filled, '#').c_str(), 100 * f,
                    mb, s > 0 ? mb / s : 0.0);
      std::cerr << line << (done == total ? "\n" : "") << std::flush;
    } else if (const int q = static_cast<int>(f * 4); q > quarter_) {
      quarter_ = q;
      std::snprintf(line, sizeof line,
                    "h2-data: %s %3.0f%% (%.1f MB, %.1f MB/s)", phase_.c_str(),
                    100 * f, mb, s > 0 ? mb / s : 0.0);
      std::cerr << line << std::endl;
    }
  }

private:
  bool quiet_, tty_;
  std::string phase_;
  std::chrono::steady_clock::time_point start_;
  int quarter_ = -1;
};

/// Removes what a failed tokenize wrote into --out (the directory too when
/// it made it), so that the same command can run again.
class out_guard {
public:
  out_guard(fs::path out, bool made) : out_(std::move(out)), made_(made) {}
  ~out_guard() {
    if (done_)
      return;
    std::error_code ec;
    if (made_) {
      fs::remove_all(out_, ec);
      return;
    }
    for (const auto& e : fs::directory_iterator(out_, ec))
      fs::remove_all(e.path(), ec);
  }
  void keep() noexcept { done_ = true; }

private:
  fs::path out_;
  bool made_;
  bool done_ = false;
};

/// --out: created, or an existing empty directory. Shards are never
/// written over. Returns whether it made the directory.
bool prepare_out(const fs::path& out) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    if (!fs::is_directory(out, ec))
      throw config_error("--out", out.string() + ": not a directory");
    if (!fs::is_empty(out, ec))
      throw config_error("--out", out.string() +
                                    ": not empty (h2-data never writes over "
                                    "shards: remove it or pick another)");
  }
  const bool made = fs::create_directories(out, ec);
  if (ec)
    throw config_error("--out",
                       out.string() + ": cannot create: " + ec.message());
  return made;
}

int tokenize(const tokenize_options& o) {
  const std::vector<fs::path> inputs(o.inputs.begin(), o.inputs.end());
  const auto bytes = corpus::input_bytes(inputs, "--input");
  if (o.tokenizer.empty() == (o.vocab_size == 0))
    throw config_error(
      "--vocab-size",
      o.tokenizer.empty()
        ? "required to train a tokenizer (or give one with "
          "--tokenizer MODEL)"
        : "trains a tokenizer, --tokenizer gives one: not both");
  out_guard guard(o.out, prepare_out(o.out));
  progress_bar bar(o.quiet);
  const auto t0 = std::chrono::steady_clock::now();
  corpus::tokenizer_training training;
  training.vocab_size = o.vocab_size;
  training.kind = o.model_type == "unigram" ? corpus::tokenizer_kind::unigram
                                            : corpus::tokenizer_kind::bpe;
  training.max_sentences = o.max_sentences;
  training.threads =
    o.threads > 0
      ? o.threads
      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto tok =
    o.tokenizer.empty()
      ? corpus::tokenizer::train(
          training, corpus::input_lines(inputs, "--input", std::ref(bar)),
          "--vocab-size")
      : corpus::tokenizer::load(o.tokenizer, "--tokenizer");
  const auto t1 = std::chrono::steady_clock::now();
  corpus::corpus_options c;
  c.inputs = inputs;
  c.out = o.out;
  c.shard_tokens = o.shard_tokens;
  c.tokenizer_type = o.tokenizer.empty() ? o.model_type : "given";
  const auto m = corpus::encode_corpus(tok, c, std::ref(bar));
  guard.keep();
  const auto t2 = std::chrono::steady_clock::now();
  const double encode_s = std::chrono::duration<double>(t2 - t1).count();
  char line[256];
  std::snprintf(line, sizeof line,
                "h2-data: %zu files, %.2f MB -> %llu tokens (%.2f bytes per "
                "token) in %zu shard%s of %s; tokenizer %s, %d pieces, %s; "
                "encoded at %.1f MB/s",
                inputs.size(), static_cast<double>(bytes) / 1e6,
                static_cast<unsigned long long>(m.tokens()),
                m.tokens() ? static_cast<double>(bytes) / m.tokens() : 0.0,
                m.shards.size(), m.shards.size() == 1 ? "" : "s", o.out.c_str(),
                c.tokenizer_type.c_str(), m.vocab_size,
                o.tokenizer.empty()
                  ? ("trained in " +
                     std::to_string(static_cast<int>(
                       std::chrono::duration<double>(t1 - t0).count() + 0.5)) +
                     " s")
                      .c_str()
                  : "given",
                encode_s > 0 ? static_cast<double>(bytes) / 1e6 / encode_s
                             : 0.0);
  std::cout << line << std::endl;
  return apps::exit_ok;
}

/// Printable: control characters but "\n" and "\t" as \xNN.
std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c < 0x20 && c != '\n' && c != '\t') {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

int inspect(const inspect_options& o) {
  const corpus::mapped_shards shards(o.dir, "DIR");
  const auto& m = shards.manifest();
  const auto tok =
    corpus::tokenizer::load(fs::path(o.dir) / m.tokenizer_file, "DIR");
  std::cout << o.dir << ": " << m.tokens() << " tokens in " << m.shards.size()
            << " shard(s), every CRC32C checked\n"
            << "tokenizer: " << m.tokenizer_file << " (" << m.tokenizer_type
            << ", " << m.vocab_size << " pieces, eos " << m.eos_id << ", "
            << m.tokenizer_hash << ")\n";
  for (const auto& s : m.shards) {
    char crc[9];
    std::snprintf(crc, sizeof crc, "%08x", s.crc32c);
    std::cout << "  " << s.file << "  " << s.tokens << " tokens  crc32c " << crc
              << "\n";
  }
  std::cout << "sources:\n";
  for (const auto& s : m.sources)
    std::cout << "  " << s.path << "  " << s.bytes << " bytes -> " << s.tokens
              << " tokens\n";
  // Windows spread evenly over the corpus, decoded.
  const std::uint64_t total = m.tokens();
  const auto want = static_cast<std::uint64_t>(std::max(0, o.window_tokens));
  for (int w = 0; w < o.windows && total > 0; ++w) {
    std::uint64_t at = total * static_cast<std::uint64_t>(w) /
                       static_cast<std::uint64_t>(o.windows);
    std::size_t shard = 0;
    while (at >= m.shards[shard].tokens) {
      at -= m.shards[shard].tokens;
      ++shard;
    }
    const auto ids = shards.shard(shard).subspan(
      at, std::min<std::uint64_t>(want, m.shards[shard].tokens - at));
    std::cout << "--- " << m.shards[shard].file << " tokens " << at << ".."
              << at + ids.size() << ":\n"
              << printable(tok.decode(ids)) << "\n";
  }
  return apps::exit_ok;
}

/// encode: stdin's text -> its ids on one line. decode: stdin's ids ->
/// their text, nothing added.
int transcode(const std::string& model, bool encode) {
  const auto tok = corpus::tokenizer::load(model, "--tokenizer");
  std::ostringstream in;
  in << std::cin.rdbuf();
  if (encode) {
    const auto text = in.str();
    if (!corpus::valid_utf8(text))
      throw config_error("stdin", "not UTF-8 text");
    const auto ids = tok.encode(text);
    for (std::size_t i = 0; i < ids.size(); ++i)
      std::cout << (i ? " " : "") << ids[i];
    std::cout << std::endl;
    return apps::exit_ok;
  }
  std::istringstream words(in.str());
  std::vector<std::uint32_t> ids;
  std::string word;
  const auto n = static_cast<unsigned long long>(tok.vocab_size());
  while (words >> word) {
    std::size_t used = 0;
    unsigned long long id = n;
    try {
      id = std::stoull(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || id >= n)
      throw config_error("stdin", "\"" + word +
                                    "\" is not a token id of this "
                                    "tokenizer (0.." +
                                    std::to_string(n - 1) + ")");
    ids.push_back(static_cast<std::uint32_t>(id));
  }
  std::cout << tok.decode(ids) << std::flush;
  return apps::exit_ok;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App cli{"Token shards for [data] source = \"shards\": train or take a "
               "SentencePiece tokenizer, encode text into uint32 shards with "
               "a manifest, inspect them (docs/data.md)."};
  cli.require_subcommand(1);
  tokenize_options t;
  auto* tok = cli.add_subcommand(
    "tokenize", "Encode text files (UTF-8) into token shards in DIR");
  tok->add_option("--input", t.inputs, "Text files, read in this order")
    ->required()
    ->expected(1, -1);
  tok->add_option("--out", t.out, "Output directory (new or empty)")
    ->required();
  tok
    ->add_option("--vocab-size", t.vocab_size,
                 "Train a tokenizer of N pieces on the inputs")
    ->check(CLI::Range(1, 1 << 24));
  tok->add_option("--model-type", t.model_type, "bpe (default) or unigram")
    ->check(CLI::IsMember({"bpe", "unigram"}));
  tok->add_option("--tokenizer", t.tokenizer,
                  "Use this SentencePiece .model instead of training one");
  tok
    ->add_option("--shard-tokens", t.shard_tokens,
                 "Tokens per shard (default 2^27: 512 MiB)")
    ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  tok
    ->add_option("--max-sentences", t.max_sentences,
                 "Lines the tokenizer trainer samples (default 2,000,000)")
    ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  tok
    ->add_option("--threads", t.threads,
                 "Trainer threads (default: every core)")
    ->check(CLI::Range(1, 1024));
  tok->add_flag("-q,--quiet", t.quiet, "No progress output");
  inspect_options in;
  auto* ins = cli.add_subcommand(
    "inspect", "Print DIR's manifest, check its shards, decode a few windows");
  ins->add_option("dir", in.dir, "Shard directory")->required();
  ins->add_option("--windows", in.windows, "Windows to decode (default 3)")
    ->check(CLI::Range(0, 1000));
  ins
    ->add_option("--window-tokens", in.window_tokens,
                 "Tokens per decoded window (default 48)")
    ->check(CLI::Range(1, 1 << 20));
  std::string model;
  auto* enc = cli.add_subcommand(
    "encode", "Print the ids of stdin's text (one line, space-separated)");
  enc->add_option("--tokenizer", model, "SentencePiece .model")->required();
  auto* dec = cli.add_subcommand(
    "decode", "Print the text of stdin's ids (whitespace-separated)");
  dec->add_option("--tokenizer", model, "SentencePiece .model")->required();
  return apps::run_cli("h2-data", [&] {
    if (const auto code = apps::parse_cli(cli, argc, argv))
      return *code;
    if (tok->parsed())
      return tokenize(t);
    if (ins->parsed())
      return inspect(in);
    return transcode(model, enc->parsed());
  });
}
