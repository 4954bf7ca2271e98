// Message tags of the pipeline: what a frame carries, for which step and
// micro-batch. Pure arithmetic shared by every backend and the runtime.
#pragma once

#include <cstdint>

namespace h2::transport {

/// What a pipeline message carries.
enum class tag_kind : std::uint8_t {
  activation = 0, ///< forward: stage s -> s + 1
  gradient = 1,   ///< backward: stage s + 1 -> s
  eval_activation = 2,
  control = 3,
};

/// Packs (kind, step, micro-batch): 2 bits of kind, 22 of micro-batch, 40 of
/// step.
constexpr std::uint64_t make_tag(tag_kind kind, std::int64_t step,
                                 int micro_batch) noexcept {
  return (static_cast<std::uint64_t>(step) << 24) |
         (static_cast<std::uint64_t>(micro_batch & 0x3fffff) << 2) |
         static_cast<std::uint64_t>(kind);
}

constexpr tag_kind tag_kind_of(std::uint64_t tag) noexcept {
  return static_cast<tag_kind>(tag & 3);
}

constexpr int tag_micro_batch(std::uint64_t tag) noexcept {
  return static_cast<int>((tag >> 2) & 0x3fffff);
}

constexpr std::int64_t tag_step(std::uint64_t tag) noexcept {
  return static_cast<std::int64_t>(tag >> 24);
}

} // namespace h2::transport
