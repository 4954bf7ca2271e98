#include "h2/corpus/shards.hpp"

#include "h2/core/crc32c.hpp"
#include "h2/core/error.hpp"

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace h2::corpus {

static_assert(std::endian::native == std::endian::little,
              "shards are little-endian uint32 read as memory");

namespace fs = std::filesystem;
using nlohmann::json;

std::uint64_t shard_manifest::tokens() const noexcept {
  std::uint64_t n = 0;
  for (const auto& s : shards)
    n += s.tokens;
  return n;
}

std::uint64_t window_count(const shard_manifest& m, int seq_len) noexcept {
  const auto t = static_cast<std::uint64_t>(seq_len);
  std::uint64_t n = 0;
  for (const auto& s : m.shards)
    n += s.tokens > t ? (s.tokens - 1) / t : 0;
  return n;
}

std::uint64_t validation_windows(std::uint64_t windows,
                                 double val_fraction) noexcept {
  return std::max<std::uint64_t>(
    1, static_cast<std::uint64_t>(
         std::floor(static_cast<double>(windows) * val_fraction)));
}

namespace {

std::string hex32(std::uint32_t v) {
  char out[9];
  std::snprintf(out, sizeof(out), "%08x", v);
  return out;
}

/// A file name that stays inside the directory: no separators, not "." or
/// "..", not empty.
bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

} // namespace

std::string sha256_of(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  H2_ENFORCE(EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(),
                        nullptr) == 1,
             "SHA-256 failed");
  std::string out = "sha256:";
  char hex[3];
  for (unsigned int i = 0; i < len; ++i) {
    std::snprintf(hex, sizeof(hex), "%02x", digest[i]);
    out += hex;
  }
  return out;
}

std::optional<std::string> file_sha256(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  if (!in || !(bytes << in.rdbuf()))
    return std::nullopt;
  return sha256_of(bytes.str());
}

std::string to_json(const shard_manifest& m) {
  json shards = json::array();
  for (const auto& s : m.shards)
    shards.push_back(
      {{"file", s.file}, {"tokens", s.tokens}, {"crc32c", hex32(s.crc32c)}});
  json sources = json::array();
  for (const auto& s : m.sources)
    sources.push_back(
      {{"path", s.path}, {"bytes", s.bytes}, {"tokens", s.tokens}});
  json j = {{"format", "h2-shards"},
            {"version", 1},
            {"dtype", "uint32"},
            {"byte_order", "little"},
            {"tokenizer",
             {{"file", m.tokenizer_file},
              {"hash", m.tokenizer_hash},
              {"type", m.tokenizer_type},
              {"vocab_size", m.vocab_size},
              {"eos_id", m.eos_id}}},
            {"tokens", m.tokens()},
            {"shards", std::move(shards)},
            {"sources", std::move(sources)}};
  return j.dump(2) + "\n";
}

shard_manifest read_shard_manifest(const fs::path& dir,
                                   const std::string& key) {
  const auto path = dir / shard_manifest_file;
  std::ifstream in(path);
  if (!in)
    throw config_error(key, path.string() +
                              ": no shard manifest (make one with h2-data "
                              "tokenize --out " +
                              dir.string() + ")");
  auto bad = [&](const std::string& why) {
    return config_error(key, path.string() + ": " + why);
  };
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw bad(std::string("not JSON: ") + e.what());
  }
  shard_manifest m;
  try {
    if (j.at("format") != "h2-shards" || j.at("version") != 1)
      throw bad("not an h2-shards manifest of version 1");
    const auto& t = j.at("tokenizer");
    m.tokenizer_file = t.at("file").get<std::string>();
    m.tokenizer_hash = t.at("hash").get<std::string>();
    m.tokenizer_type = t.at("type").get<std::string>();
    m.vocab_size = t.at("vocab_size").get<int>();
    m.eos_id = t.at("eos_id").get<int>();
    if (!plain_name(m.tokenizer_file))
      throw bad("tokenizer.file \"" + m.tokenizer_file +
                "\" is not a file name in the directory");
    if (m.vocab_size < 1)
      throw bad("tokenizer.vocab_size must be positive");
    for (const auto& s : j.at("shards")) {
      shard_info info;
      info.file = s.at("file").get<std::string>();
      info.tokens = s.at("tokens").get<std::uint64_t>();
      const auto crc = s.at("crc32c").get<std::string>();
      std::size_t used = 0;
      info.crc32c = static_cast<std::uint32_t>(std::stoul(crc, &used, 16));
      if (used != crc.size() || crc.size() != 8)
        throw bad("crc32c \"" + crc + "\" is not 8 hex digits");
      if (!plain_name(info.file))
        throw bad("shard \"" + info.file +
                  "\" is not a file name in the directory");
      m.shards.push_back(std::move(info));
    }
    for (const auto& s : j.at("sources"))
      m.sources.push_back({s.at("path").get<std::string>(),
                           s.at("bytes").get<std::uint64_t>(),
                           s.at("tokens").get<std::uint64_t>()});
  } catch (const json::exception& e) {
    throw bad(std::string("malformed: ") + e.what());
  } catch (const std::invalid_argument&) {
    throw bad("a crc32c is not hexadecimal");
  } catch (const std::out_of_range&) {
    throw bad("a crc32c is out of range");
  }
  if (m.shards.empty())
    throw bad("lists no shard");
  return m;
}

// ---------------------------------------------------------------------------

namespace {
constexpr std::size_t writer_buffer_tokens = 1 << 18; // 1 MiB
}

shard_writer::shard_writer(fs::path dir, std::uint64_t shard_tokens)
    : dir_(std::move(dir)), shard_tokens_(shard_tokens) {
  H2_ENFORCE(shard_tokens_ > 0, "shard_tokens=0");
  buffer_.reserve(writer_buffer_tokens);
}

shard_writer::~shard_writer() {
  if (fd_ >= 0)
    ::close(fd_);
}

void shard_writer::open_next() {
  char name[32];
  std::snprintf(name, sizeof(name), "shard-%05zu.bin", shards_.size());
  const auto path = dir_ / name;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw error(path.string() + ": cannot create: " + std::strerror(errno));
  shards_.push_back({name, 0, 0});
}

void shard_writer::flush() {
  auto& s = shards_.back();
  const char* p = reinterpret_cast<const char*>(buffer_.data());
  std::size_t left = buffer_.size() * sizeof(std::uint32_t);
  s.crc32c = crc32c(p, left, s.crc32c);
  while (left > 0) {
    const auto n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      throw error((dir_ / s.file).string() +
                  ": cannot write: " + std::strerror(errno));
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  buffer_.clear();
}

void shard_writer::write(std::span<const std::uint32_t> tokens) {
  while (!tokens.empty()) {
    if (fd_ < 0)
      open_next();
    auto& s = shards_.back();
    const auto room = std::min<std::uint64_t>(
      shard_tokens_ - s.tokens, writer_buffer_tokens - buffer_.size());
    const auto n =
      static_cast<std::size_t>(std::min<std::uint64_t>(room, tokens.size()));
    buffer_.insert(buffer_.end(), tokens.begin(), tokens.begin() + n);
    s.tokens += n;
    tokens = tokens.subspan(n);
    if (buffer_.size() == writer_buffer_tokens || s.tokens == shard_tokens_)
      flush();
    if (s.tokens == shard_tokens_) {
      if (::close(fd_) != 0)
        throw error((dir_ / s.file).string() +
                    ": cannot close: " + std::strerror(errno));
      fd_ = -1;
    }
  }
}

std::vector<shard_info> shard_writer::finish() {
  if (fd_ >= 0) {
    flush();
    if (::close(fd_) != 0)
      throw error((dir_ / shards_.back().file).string() +
                  ": cannot close: " + std::strerror(errno));
    fd_ = -1;
  }
  return shards_;
}

// ---------------------------------------------------------------------------

mapped_shards::mapped_shards(const fs::path& dir, const std::string& key)
    : dir_(dir), manifest_(read_shard_manifest(dir, key)) {
  const auto tokenizer_path = dir / manifest_.tokenizer_file;
  const auto hash = file_sha256(tokenizer_path);
  if (!hash)
    throw config_error(key,
                       tokenizer_path.string() + ": cannot read the tokenizer");
  if (*hash != manifest_.tokenizer_hash)
    throw config_error(key, tokenizer_path.string() + ": its hash " + *hash +
                              " is not the manifest's " +
                              manifest_.tokenizer_hash +
                              " (the shards were made by another tokenizer)");
  try {
    for (const auto& s : manifest_.shards) {
      const auto path = dir / s.file;
      auto fail = [&](const std::string& why) {
        return config_error(key, path.string() + ": " + why);
      };
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        throw fail(std::string("cannot open: ") + std::strerror(errno));
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw fail("not a regular file");
      }
      const auto bytes = static_cast<std::uint64_t>(st.st_size);
      if (bytes != s.tokens * sizeof(std::uint32_t)) {
        ::close(fd);
        throw fail(std::to_string(bytes) + " bytes, the manifest says " +
                   std::to_string(s.tokens) + " tokens (" +
                   std::to_string(s.tokens * 4) + " bytes)");
      }
      map m;
      m.bytes = static_cast<std::size_t>(bytes);
      if (m.bytes > 0) {
        m.data = ::mmap(nullptr, m.bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m.data == MAP_FAILED) {
          ::close(fd);
          throw fail(std::string("cannot map: ") + std::strerror(errno));
        }
      }
      ::close(fd);
      maps_.push_back(m);
      const auto crc = crc32c(m.data, m.bytes);
      if (crc != s.crc32c)
        throw fail("damaged: its CRC32C is " + hex32(crc) +
                   ", the manifest says " + hex32(s.crc32c));
      const auto ids = shard(maps_.size() - 1);
      const auto largest =
        ids.empty() ? 0u : *std::max_element(ids.begin(), ids.end());
      if (!ids.empty() &&
          largest >= static_cast<std::uint32_t>(manifest_.vocab_size))
        throw fail("holds token id " + std::to_string(largest) +
                   ", outside the tokenizer's vocabulary of " +
                   std::to_string(manifest_.vocab_size));
    }
  } catch (...) {
    for (auto& m : maps_)
      if (m.data != nullptr)
        ::munmap(m.data, m.bytes);
    throw;
  }
}

mapped_shards::~mapped_shards() {
  for (auto& m : maps_)
    if (m.data != nullptr)
      ::munmap(m.data, m.bytes);
}

std::span<const std::uint32_t> mapped_shards::shard(std::size_t i) const {
  H2_ENFORCE(i < maps_.size(), "shard ", i, " of ", maps_.size());
  return {static_cast<const std::uint32_t*>(maps_[i].data),
          maps_[i].bytes / sizeof(std::uint32_t)};
}

} // namespace h2::corpus
