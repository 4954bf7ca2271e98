// `[data] source = "shards"` (docs/data.md, "Order"): windows of token
// shards in a documented, stateless order, so that any chip can draw any
// sequence of any step and a resumed run continues with exactly the next
// batch.
#include "h2/model/data.hpp"

#include "h2/core/error.hpp"

#include <algorithm>
#include <bit>

namespace h2::model {

namespace {

std::uint64_t splitmix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

} // namespace

std::uint64_t shuffle_position(std::uint64_t position, std::uint64_t n,
                               std::uint64_t key) noexcept {
  if (n <= 1)
    return 0;
  // A balanced Feistel network on 2h bits (4^h >= n), cycle-walked into
  // [0, n): a bijection of [0, n) for every key, computed in O(1).
  const int bits = std::bit_width(n - 1);
  const int h = (bits + 1) / 2;
  const std::uint64_t mask = (std::uint64_t{1} << h) - 1;
  std::uint64_t x = position;
  do {
    std::uint64_t left = x >> h, right = x & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      const std::uint64_t f = splitmix64(key ^ (round << 56) ^ right) & mask;
      const std::uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << h) | right;
  } while (x >= n);
  return x;
}

shard_source::shard_source(const data_config& data, int seq_len, int vocab_size,
                           int global_batch, std::uint64_t seed)
    : data_source(seq_len),
      shards_(data.shards_dir, "data.shards"),
      global_batch_(global_batch),
      seed_(seed) {
  const auto& m = shards_.manifest();
  if (m.vocab_size > vocab_size)
    throw config_error("model.vocab_size",
                       std::to_string(vocab_size) + " is smaller than the " +
                         std::to_string(m.vocab_size) +
                         " ids of the tokenizer of " + data.shards_dir + " (" +
                         m.tokenizer_hash + ")");
  const std::uint64_t t = static_cast<std::uint64_t>(seq_len);
  std::uint64_t windows = 0;
  for (std::size_t i = 0; i < shards_.size(); ++i) {
    const std::uint64_t n = shards_.shard(i).size();
    if (n < t + 1)
      throw config_error("data.shards",
                         (shards_.dir() / m.shards[i].file).string() +
                           " holds " + std::to_string(n) +
                           " tokens, fewer than a window of " +
                           "model.seq_len + 1 = " + std::to_string(t + 1));
    first_window_.push_back(windows);
    windows += (n - 1) / t;
  }
  first_window_.push_back(windows);
  H2_ENFORCE(windows == corpus::window_count(m, seq_len), "windows=", windows);
  val_windows_ = corpus::validation_windows(windows, data.val_fraction);
  if (val_windows_ >= windows)
    throw config_error(
      "data.val_fraction",
      "leaves no training window: " + data.shards_dir + " holds " +
        std::to_string(windows) +
        " windows of model.seq_len + 1 = " + std::to_string(t + 1) + " tokens");
  train_windows_ = windows - val_windows_;
}

std::uint64_t shard_source::windows(split s) const noexcept {
  return s == split::train ? train_windows_ : val_windows_;
}

std::uint64_t shard_source::window_of(split s, std::int64_t batch,
                                      std::int64_t index) const noexcept {
  const std::uint64_t k = static_cast<std::uint64_t>(batch) *
                            static_cast<std::uint64_t>(global_batch_) +
                          static_cast<std::uint64_t>(index);
  if (s == split::validation)
    return train_windows_ + k % val_windows_;
  const std::uint64_t epoch = k / train_windows_;
  return shuffle_position(k % train_windows_, train_windows_,
                          splitmix64(seed_ ^ splitmix64(epoch + 1)));
}

std::uint64_t shard_source::epoch_of(std::int64_t sequences) const noexcept {
  return static_cast<std::uint64_t>(sequences) / train_windows_;
}

void shard_source::sequence(split s, std::int64_t batch, std::int64_t index,
                            std::int64_t* inputs, std::int64_t* targets) const {
  const std::uint64_t w = window_of(s, batch, index);
  const auto it =
    std::upper_bound(first_window_.begin(), first_window_.end(), w) - 1;
  const auto shard = static_cast<std::size_t>(it - first_window_.begin());
  const std::size_t t = static_cast<std::size_t>(seq_len());
  const auto tokens = shards_.shard(shard).subspan((w - *it) * t, t + 1);
  for (std::size_t i = 0; i < t; ++i) {
    inputs[i] = tokens[i];
    targets[i] = tokens[i + 1];
  }
}

} // namespace h2::model
