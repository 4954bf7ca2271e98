// Training data. Every source is deterministic and stateless: sequence i of
// global batch b of a split is the same whenever and wherever it is asked
// for, so the first and last stage draw matching tokens and targets without
// exchanging them, and a resumed run continues the same stream.
#pragma once

#include "h2/core/job.hpp"
#include "h2/corpus/shards.hpp"
#include "h2/model/layers.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace h2::model {

enum class split { train, validation };

class data_source {
public:
  virtual ~data_source() = default;

  /// Sequences [first, first + count) of global batch `batch` of `s` as a
  /// micro-batch of [count, seq_len] int64 tensors, allocated on the calling
  /// thread.
  micro_batch batch(split s, std::int64_t batch, int first, int count,
                    double loss_scale) const;

  int seq_len() const noexcept { return seq_len_; }

protected:
  explicit data_source(int seq_len) : seq_len_(seq_len) {}

  /// Writes seq_len inputs and seq_len targets of one sequence.
  virtual void sequence(split s, std::int64_t batch, std::int64_t index,
                        std::int64_t* inputs, std::int64_t* targets) const = 0;

private:
  int seq_len_;
};

/// A seeded random Markov chain over vocab_size - 1 states whose every row
/// has entropy exactly `entropy_rate` nats, so the chain's entropy rate is
/// exactly that. Each sequence is a document: BOS (id vocab_size - 1), then
/// a walk started from the stationary distribution pi. Predicting its T
/// targets costs at best ((T - 1) H + H(pi)) / T nats per token.
class markov_source final : public data_source {
public:
  markov_source(int vocab_size, int seq_len, double entropy_rate,
                std::uint64_t seed);

  int states() const noexcept { return states_; }
  int bos() const noexcept { return states_; }

  /// H: the entropy of every row, nats.
  double entropy_rate() const noexcept { return entropy_rate_; }

  /// The stationary distribution (power iteration to 1e-15).
  const std::vector<double>& stationary() const noexcept { return stationary_; }

  /// H(pi), nats.
  double stationary_entropy() const noexcept;

  /// ((T - 1) H + H(pi)) / T: the lowest mean loss any model can reach.
  double achievable_loss() const noexcept;

  /// Row `state` of the transition matrix.
  std::vector<double> transition_row(int state) const;

protected:
  void sequence(split s, std::int64_t batch, std::int64_t index,
                std::int64_t* inputs, std::int64_t* targets) const override;

private:
  int sample(const double* cumulative, double u) const noexcept;

  int states_;
  double entropy_rate_;
  std::uint64_t seed_;
  std::vector<double> cumulative_; ///< states_ x states_, row-wise CDFs
  std::vector<double> stationary_;
  std::vector<double> stationary_cumulative_;
};

/// Tokenised data files in nanoGPT's layout (raw little-endian uint16) or
/// llm.c's (256 x int32 header with magic 20240520, version 1, token count;
/// then uint16 tokens), told apart by the magic. Windows of seq_len + 1
/// tokens are drawn at seeded random offsets.
class token_file_source final : public data_source {
public:
  enum class layout { nanogpt, llmc };

  /// Maps the files; throws config_error naming data.train / data.val when a
  /// file cannot be read, is malformed, too short, or holds a token id
  /// >= vocab_size.
  token_file_source(const data_config& data, int seq_len, int vocab_size,
                    std::uint64_t seed);
  ~token_file_source() override;

  layout train_layout() const noexcept { return train_.format; }
  std::size_t tokens(split s) const noexcept;

protected:
  void sequence(split s, std::int64_t batch, std::int64_t index,
                std::int64_t* inputs, std::int64_t* targets) const override;

private:
  struct mapped_file {
    void* map = nullptr;
    std::size_t map_bytes = 0;
    const std::uint16_t* tokens = nullptr;
    std::size_t count = 0;
    layout format = layout::nanogpt;
  };
  struct range {
    const std::uint16_t* tokens = nullptr;
    std::size_t count = 0;
  };

  static mapped_file map_file(const std::string& path, const std::string& key,
                              int vocab_size);
  static void unmap(mapped_file& f) noexcept;

  mapped_file train_, val_;
  range train_range_, val_range_;
  std::uint64_t seed_;
};

/// Position `position` of a keyed pseudo-random permutation of [0, n): a
/// Feistel network cycle-walked into the range, so the shuffle of an epoch
/// of any size costs O(1) memory and time per draw.
std::uint64_t shuffle_position(std::uint64_t position, std::uint64_t n,
                               std::uint64_t key) noexcept;

/// Token shards (shards.hpp; docs/data.md, "Order"). Each shard is cut into
/// windows of seq_len + 1 tokens at a stride of seq_len, numbered through
/// the shards in manifest order; the last max(1, floor(val_fraction x
/// windows)) are the validation split, read in order; the rest are shuffled
/// once per epoch by shuffle_position keyed on (seed, epoch). Training
/// sequence k of the run (k = batch x global_batch + index) is position
/// k mod T of epoch k / T (T training windows).
class shard_source final : public data_source {
public:
  /// Maps and checks the shards (mapped_shards). Throws config_error naming
  /// model.vocab_size when the tokenizer's vocabulary is larger than the
  /// model's, data.shards naming a shard shorter than a window,
  /// data.val_fraction when no training window is left.
  shard_source(const data_config& data, int seq_len, int vocab_size,
               int global_batch, std::uint64_t seed);

  std::uint64_t windows(split s) const noexcept;
  /// The window (over all shards) of sequence `index` of batch `batch`.
  std::uint64_t window_of(split s, std::int64_t batch,
                          std::int64_t index) const noexcept;
  /// The epoch that training sequence number `sequences` falls in.
  std::uint64_t epoch_of(std::int64_t sequences) const noexcept;
  const corpus::shard_manifest& manifest() const noexcept {
    return shards_.manifest();
  }

protected:
  void sequence(split s, std::int64_t batch, std::int64_t index,
                std::int64_t* inputs, std::int64_t* targets) const override;

private:
  corpus::mapped_shards shards_;
  int global_batch_;
  std::uint64_t seed_;
  std::vector<std::uint64_t> first_window_; ///< per shard, then the total
  std::uint64_t train_windows_ = 0, val_windows_ = 0;
};

/// The source a job asks for.
std::unique_ptr<data_source> make_data_source(const job_config& job);

/// Writes `tokens` as an llm.c-format file (for tests and tools).
void write_llmc_tokens(const std::string& path,
                       const std::vector<std::uint16_t>& tokens);

} // namespace h2::model
