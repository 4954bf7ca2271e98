#include "h2/corpus/encode.hpp"

#include "h2/core/error.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

namespace h2::corpus {

namespace fs = std::filesystem;

bool valid_utf8(std::string_view text) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n = 0;
    std::uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= n)
      return false;
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xc0) != 0x80)
        return false;
      cp = (cp << 6) | (p[i] & 0x3f);
    }
    static constexpr std::uint32_t smallest[] = {0, 0x80, 0x800, 0x10000};
    if (cp < smallest[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    p += n + 1;
  }
  return true;
}

std::uint64_t input_bytes(const std::vector<fs::path>& inputs,
                          const std::string& key) {
  if (inputs.empty())
    throw config_error(key, "no input file");
  std::uint64_t total = 0;
  for (const auto& path : inputs) {
    std::error_code ec;
    const auto status = fs::status(path, ec);
    if (ec || !fs::exists(status))
      throw config_error(key, path.string() + ": no such file");
    if (!fs::is_regular_file(status))
      throw config_error(key, path.string() + ": not a regular file");
    std::ifstream probe(path, std::ios::binary);
    if (!probe)
      throw config_error(key, path.string() +
                                ": cannot read: " + std::strerror(errno));
    total += fs::file_size(path, ec);
  }
  return total;
}

namespace {

/// The inputs' lines one by one, each with its line break when it has one.
class line_reader {
public:
  line_reader(std::vector<fs::path> inputs, std::string key,
              corpus_progress progress, std::string phase)
      : inputs_(std::move(inputs)),
        key_(std::move(key)),
        progress_(std::move(progress)),
        phase_(std::move(phase)) {
    for (const auto& p : inputs_) {
      std::error_code ec;
      total_ += fs::file_size(p, ec);
    }
  }

  /// The next line of the current file ("\n" kept); false at its end.
  bool next_line(std::string& line) {
    if (!in_.is_open() || !std::getline(in_, line))
      return false;
    ++line_number_;
    const bool broken = !in_.eof();
    done_ += line.size() + (broken ? 1 : 0);
    if (!valid_utf8(line))
      throw config_error(key_, inputs_[file_].string() + ":" +
                                 std::to_string(line_number_) +
                                 ": not UTF-8 text (h2-data reads UTF-8)");
    if (broken)
      line += '\n';
    if (progress_ && done_ - reported_ >= (1u << 20)) {
      reported_ = done_;
      progress_(phase_, done_, total_);
    }
    return true;
  }

  /// Opens the next file; false after the last.
  bool next_file() {
    if (in_.is_open()) {
      in_.close();
      ++file_;
    }
    if (file_ >= inputs_.size()) {
      if (progress_)
        progress_(phase_, total_, total_);
      return false;
    }
    in_.open(inputs_[file_], std::ios::binary);
    if (!in_)
      throw config_error(key_, inputs_[file_].string() +
                                 ": cannot read: " + std::strerror(errno));
    line_number_ = 0;
    return true;
  }

  std::size_t file() const noexcept { return file_; }

private:
  std::vector<fs::path> inputs_;
  std::string key_;
  corpus_progress progress_;
  std::string phase_;
  std::ifstream in_;
  std::size_t file_ = 0;
  std::uint64_t line_number_ = 0;
  std::uint64_t done_ = 0, reported_ = 0, total_ = 0;
};

} // namespace

line_source input_lines(const std::vector<fs::path>& inputs,
                        const std::string& key,
                        const corpus_progress& progress) {
  auto reader =
    std::make_shared<line_reader>(inputs, key, progress, "training");
  auto started = std::make_shared<bool>(false);
  return [reader, started](std::string& line) {
    if (!*started) {
      *started = true;
      if (!reader->next_file())
        return false;
    }
    while (!reader->next_line(line))
      if (!reader->next_file())
        return false;
    // The trainer sees lines without their breaks ("\n" is a piece of its
    // own).
    if (!line.empty() && line.back() == '\n')
      line.pop_back();
    return true;
  };
}

namespace {

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out)
    throw error(path.string() + ": cannot write: " + std::strerror(errno));
}

} // namespace

shard_manifest encode_corpus(const tokenizer& tok, const corpus_options& o,
                             const corpus_progress& progress) {
  shard_manifest m;
  m.tokenizer_hash = tok.hash();
  m.tokenizer_type = o.tokenizer_type;
  m.vocab_size = tok.vocab_size();
  m.eos_id = tok.eos_id();
  write_file(o.out / m.tokenizer_file, tok.model_bytes());
  shard_writer writer(o.out, o.shard_tokens);
  line_reader reader(o.inputs, "--input", progress, "encoding");
  std::vector<std::uint32_t> ids;
  std::string line;
  while (reader.next_file()) {
    shard_source_file source;
    source.path = o.inputs[reader.file()].string();
    std::error_code ec;
    source.bytes = fs::file_size(o.inputs[reader.file()], ec);
    while (reader.next_line(line)) {
      ids.clear();
      tok.encode(line, ids);
      writer.write(ids);
      source.tokens += ids.size();
    }
    if (m.eos_id >= 0) {
      const std::uint32_t eos = static_cast<std::uint32_t>(m.eos_id);
      writer.write({&eos, 1});
      ++source.tokens;
    }
    m.sources.push_back(std::move(source));
  }
  m.shards = writer.finish();
  // The manifest last, by rename: a directory without one is unfinished.
  const auto tmp = o.out / (std::string(shard_manifest_file) + ".tmp");
  write_file(tmp, to_json(m));
  fs::rename(tmp, o.out / shard_manifest_file);
  return m;
}

} // namespace h2::corpus
