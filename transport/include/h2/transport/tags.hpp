// Message tags of the pipeline: what a frame carries, for which step,
// micro-batch and chunk. Pure arithmetic shared by every backend and the runtime.
#pragma once

#include <cstdint>

namespace h2::transport {

/// What a pipeline message carries.
enum class tag_kind : std::uint8_t {
  activation = 0, ///< forward: chunk c -> c + 1
  gradient = 1,   ///< backward: chunk c + 1 -> c
  eval_activation = 2,
  control = 3,
};

/// Chunks of a pipeline a tag can name (plans hold fewer: a chunk holds at
/// least one layer of at most 8,194).
inline constexpr int max_tag_chunks = 1 << 14;

/// Packs (kind, step, micro-batch, chunk): 2 bits of kind, 22 of
/// micro-batch, 14 of the chunk, 26 of step. `chunk` is the chunk the
/// message goes to (the receiving chunk, for activations and gradients
/// alike). Steps wrap every 2^26 (67 million) steps, harmless: only the
/// messages of one step or its neighbour are ever in flight.
constexpr std::uint64_t make_tag(tag_kind kind, std::int64_t step,
                                 int micro_batch, int chunk = 0) noexcept {
  return (static_cast<std::uint64_t>(step) << 38) |
         (static_cast<std::uint64_t>(chunk & 0x3fff) << 24) |
         (static_cast<std::uint64_t>(micro_batch & 0x3fffff) << 2) |
         static_cast<std::uint64_t>(kind);
}

constexpr tag_kind tag_kind_of(std::uint64_t tag) noexcept {
  return static_cast<tag_kind>(tag & 3);
}

constexpr int tag_micro_batch(std::uint64_t tag) noexcept {
  return static_cast<int>((tag >> 2) & 0x3fffff);
}

constexpr int tag_chunk(std::uint64_t tag) noexcept {
  return static_cast<int>((tag >> 24) & 0x3fff);
}

/// The step modulo 2^26.
constexpr std::int64_t tag_step(std::uint64_t tag) noexcept {
  return static_cast<std::int64_t>(tag >> 38);
}

} // namespace h2::transport
