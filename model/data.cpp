#include "h2/model/data.hpp"

#include "h2/core/error.hpp"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace h2::model {

namespace {

/// SplitMix64: a counter-based stream, cheap to start at any key.
class splitmix {
public:
  explicit splitmix(std::uint64_t key) : state_(key) {}

  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  /// Uniform in [0, 1) with 53 random bits.
  double uniform() noexcept {
    return static_cast<double>(next() >> 11) * 0x1.0p-53;
  }

  double normal() noexcept { // Box-Muller
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * M_PI * u2);
  }

private:
  std::uint64_t state_;
};

std::uint64_t mix(std::uint64_t a, std::uint64_t b) {
  return splitmix(a * 0x100000001b3ULL ^ (b + 0x632be59bd9b4e019ULL)).next();
}

std::uint64_t sequence_key(std::uint64_t seed, split s, std::int64_t batch,
                           std::int64_t index) {
  return mix(mix(mix(seed, s == split::train ? 1 : 2),
                 static_cast<std::uint64_t>(batch)),
             static_cast<std::uint64_t>(index));
}

double entropy(const std::vector<double>& p) {
  double h = 0;
  for (double x : p)
    if (x > 0)
      h -= x * std::log(x);
  return h;
}

/// softmax(beta * z)
std::vector<double> softmax(const std::vector<double>& z, double beta) {
  double zmax = *std::max_element(z.begin(), z.end());
  std::vector<double> p(z.size());
  double sum = 0;
  for (std::size_t i = 0; i < z.size(); ++i)
    sum += p[i] = std::exp(beta * (z[i] - zmax));
  for (double& x : p)
    x /= sum;
  return p;
}

/// The distribution softmax(beta z) whose entropy is `target`: entropy falls
/// monotonically from ln(n) at beta = 0 towards 0, so bisect on beta.
std::vector<double> row_with_entropy(const std::vector<double>& z,
                                     double target) {
  double lo = 0, hi = 1;
  while (entropy(softmax(z, hi)) > target)
    hi *= 2;
  for (int i = 0; i < 200 && hi - lo > 1e-15 * hi; ++i) {
    double mid = 0.5 * (lo + hi);
    (entropy(softmax(z, mid)) > target ? lo : hi) = mid;
  }
  return softmax(z, 0.5 * (lo + hi));
}

} // namespace

micro_batch data_source::batch(split s, std::int64_t batch, int first,
                               int count, double loss_scale) const {
  micro_batch mb;
  mb.tokens = at::empty({count, seq_len_}, at::kLong);
  mb.targets = at::empty({count, seq_len_}, at::kLong);
  auto* in = mb.tokens.data_ptr<std::int64_t>();
  auto* out = mb.targets.data_ptr<std::int64_t>();
  for (int i = 0; i < count; ++i)
    sequence(s, batch, first + i,
             in + static_cast<std::ptrdiff_t>(i) * seq_len_,
             out + static_cast<std::ptrdiff_t>(i) * seq_len_);
  mb.loss_scale = loss_scale;
  return mb;
}

markov_source::markov_source(int vocab_size, int seq_len, double entropy_rate,
                             std::uint64_t seed)
    : data_source(seq_len),
      states_(vocab_size - 1),
      entropy_rate_(entropy_rate),
      seed_(seed) {
  H2_ENFORCE(states_ >= 2 && entropy_rate > 0 &&
               entropy_rate < std::log(static_cast<double>(states_)),
             "states=", states_, " H=", entropy_rate);
  const auto n = static_cast<std::size_t>(states_);
  std::vector<double> matrix(n * n);
  cumulative_.resize(n * n);
  for (std::size_t r = 0; r < n; ++r) {
    splitmix rng(mix(mix(seed, 0x6d61726b6f76ULL), r));
    std::vector<double> z(n);
    for (double& x : z)
      x = rng.normal();
    auto row = row_with_entropy(z, entropy_rate);
    double acc = 0;
    for (std::size_t c = 0; c < n; ++c) {
      matrix[r * n + c] = row[c];
      cumulative_[r * n + c] = acc += row[c];
    }
    cumulative_[r * n + n - 1] = 1.0;
  }
  // Every entry is positive: the chain is ergodic and aperiodic, and power
  // iteration converges to its unique stationary distribution.
  stationary_.assign(n, 1.0 / static_cast<double>(n));
  for (int it = 0; it < 100000; ++it) {
    std::vector<double> next(n, 0.0);
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t c = 0; c < n; ++c)
        next[c] += stationary_[r] * matrix[r * n + c];
    double sum = 0, delta = 0;
    for (double x : next)
      sum += x;
    for (std::size_t c = 0; c < n; ++c) {
      next[c] /= sum;
      delta = std::max(delta, std::abs(next[c] - stationary_[c]));
    }
    stationary_ = std::move(next);
    if (delta < 1e-15)
      break;
  }
  double acc = 0;
  for (double p : stationary_)
    stationary_cumulative_.push_back(acc += p);
  stationary_cumulative_.back() = 1.0;
}

double markov_source::stationary_entropy() const noexcept {
  return entropy(stationary_);
}

double markov_source::achievable_loss() const noexcept {
  double t = seq_len();
  return ((t - 1) * entropy_rate_ + stationary_entropy()) / t;
}

std::vector<double> markov_source::transition_row(int state) const {
  const auto n = static_cast<std::size_t>(states_);
  std::vector<double> row(n);
  double prev = 0;
  for (std::size_t c = 0; c < n; ++c) {
    double cur = cumulative_[static_cast<std::size_t>(state) * n + c];
    row[c] = cur - prev;
    prev = cur;
  }
  return row;
}

int markov_source::sample(const double* cumulative, double u) const noexcept {
  const double* end = cumulative + states_;
  const double* it = std::upper_bound(cumulative, end, u);
  return it == end ? states_ - 1 : static_cast<int>(it - cumulative);
}

void markov_source::sequence(split s, std::int64_t batch, std::int64_t index,
                             std::int64_t* inputs,
                             std::int64_t* targets) const {
  splitmix rng(sequence_key(seed_, s, batch, index));
  const int t = seq_len();
  int state = sample(stationary_cumulative_.data(), rng.uniform());
  inputs[0] = bos();
  for (int i = 0; i < t; ++i) {
    targets[i] = state;
    if (i + 1 < t) {
      inputs[i + 1] = state;
      state = sample(cumulative_.data() + static_cast<std::size_t>(state) *
                                            static_cast<std::size_t>(states_),
                     rng.uniform());
    }
  }
}

// ---------------------------------------------------------------------------

namespace {
constexpr std::int32_t llmc_magic = 20240520;
constexpr std::int32_t llmc_version = 1;
constexpr std::size_t llmc_header_bytes = 256 * sizeof(std::int32_t);
} // namespace

token_file_source::mapped_file
token_file_source::map_file(const std::string& path, const std::string& key,
                            int vocab_size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw config_error(key,
                       "cannot open \"" + path + "\": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw config_error(key, "\"" + path + "\" is not a regular file");
  }
  mapped_file f;
  f.map_bytes = static_cast<std::size_t>(st.st_size);
  if (f.map_bytes < 4) {
    ::close(fd);
    throw config_error(key, "\"" + path + "\" is too short to hold tokens");
  }
  f.map = ::mmap(nullptr, f.map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (f.map == MAP_FAILED) {
    f.map = nullptr;
    throw config_error(key,
                       "cannot map \"" + path + "\": " + std::strerror(errno));
  }
  auto fail = [&](const std::string& why) {
    unmap(f);
    throw config_error(key, "\"" + path + "\": " + why);
  };
  std::int32_t magic = 0;
  std::memcpy(&magic, f.map, sizeof(magic));
  const auto* bytes = static_cast<const unsigned char*>(f.map);
  if (magic == llmc_magic) {
    if (f.map_bytes < llmc_header_bytes)
      fail("llm.c header truncated");
    std::int32_t header[3];
    std::memcpy(header, bytes, sizeof(header));
    if (header[1] != llmc_version)
      fail("llm.c token file version " + std::to_string(header[1]) +
           " is not supported (expected 1: uint16 tokens)");
    if (header[2] < 0 ||
        llmc_header_bytes + 2 * static_cast<std::size_t>(header[2]) !=
          f.map_bytes)
      fail("llm.c header says " + std::to_string(header[2]) +
           " tokens but the file holds " +
           std::to_string((f.map_bytes - llmc_header_bytes) / 2));
    f.format = layout::llmc;
    f.tokens =
      reinterpret_cast<const std::uint16_t*>(bytes + llmc_header_bytes);
    f.count = static_cast<std::size_t>(header[2]);
  } else {
    if (f.map_bytes % 2 != 0)
      fail("odd size: not a nanoGPT uint16 token file (and no llm.c magic)");
    f.format = layout::nanogpt;
    f.tokens = reinterpret_cast<const std::uint16_t*>(bytes);
    f.count = f.map_bytes / 2;
  }
  for (std::size_t i = 0; i < f.count; ++i)
    if (f.tokens[i] >= vocab_size)
      fail("token id " + std::to_string(f.tokens[i]) + " at position " +
           std::to_string(i) +
           " is >= model.vocab_size = " + std::to_string(vocab_size));
  return f;
}

void token_file_source::unmap(mapped_file& f) noexcept {
  if (f.map != nullptr)
    ::munmap(f.map, f.map_bytes);
  f = {};
}

token_file_source::token_file_source(const data_config& data, int seq_len,
                                     int vocab_size, std::uint64_t seed)
    : data_source(seq_len), seed_(seed) {
  const std::size_t window = static_cast<std::size_t>(seq_len) + 1;
  train_ = map_file(data.train_path, "data.train", vocab_size);
  try {
    if (!data.val_path.empty()) {
      val_ = map_file(data.val_path, "data.val", vocab_size);
      train_range_ = {train_.tokens, train_.count};
      val_range_ = {val_.tokens, val_.count};
    } else {
      auto held_out = static_cast<std::size_t>(
        std::floor(static_cast<double>(train_.count) * data.val_fraction));
      train_range_ = {train_.tokens, train_.count - held_out};
      val_range_ = {train_.tokens + (train_.count - held_out), held_out};
    }
    if (train_range_.count < window)
      throw config_error(
        "data.train", "holds " + std::to_string(train_range_.count) +
                        " training tokens; seq_len " + std::to_string(seq_len) +
                        " needs at least " + std::to_string(window));
    if (val_range_.count < window)
      throw config_error(
        data.val_path.empty() ? "data.val_fraction" : "data.val",
        "leaves " + std::to_string(val_range_.count) +
          " validation tokens; seq_len " + std::to_string(seq_len) +
          " needs at least " + std::to_string(window));
  } catch (...) {
    unmap(train_);
    unmap(val_);
    throw;
  }
}

token_file_source::~token_file_source() {
  unmap(train_);
  unmap(val_);
}

std::size_t token_file_source::tokens(split s) const noexcept {
  return s == split::train ? train_range_.count : val_range_.count;
}

void token_file_source::sequence(split s, std::int64_t batch,
                                 std::int64_t index, std::int64_t* inputs,
                                 std::int64_t* targets) const {
  const range& r = s == split::train ? train_range_ : val_range_;
  const std::size_t t = static_cast<std::size_t>(seq_len());
  splitmix rng(sequence_key(seed_, s, batch, index));
  std::size_t offset = rng.next() % (r.count - t);
  for (std::size_t i = 0; i < t; ++i) {
    inputs[i] = r.tokens[offset + i];
    targets[i] = r.tokens[offset + i + 1];
  }
}

std::unique_ptr<data_source> make_data_source(const job_config& job) {
  if (job.data.source == source_kind::markov)
    return std::make_unique<markov_source>(
      job.model.vocab_size, job.model.seq_len, job.data.entropy_rate, job.seed);
  if (job.data.source == source_kind::shards)
    return std::make_unique<shard_source>(job.data, job.model.seq_len,
                                          job.model.vocab_size,
                                          job.train.global_batch, job.seed);
  return std::make_unique<token_file_source>(job.data, job.model.seq_len,
                                             job.model.vocab_size, job.seed);
}

void write_llmc_tokens(const std::string& path,
                       const std::vector<std::uint16_t>& tokens) {
  std::int32_t header[256] = {};
  header[0] = llmc_magic;
  header[1] = llmc_version;
  header[2] = static_cast<std::int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * 2));
  if (!out)
    throw error("cannot write " + path);
}

} // namespace h2::model
