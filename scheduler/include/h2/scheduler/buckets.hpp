// How a reduction group's gradients are cut into buckets, one rule for the
// runtime's all-reduce and ZeRO-1 (runtime/optimizer_shards.hpp) and the
// cost model that prices them (cost_model::buckets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace h2::scheduler {

/// Parameters [first, end) of a group's list, reduced as one flat tensor
/// of `numel` elements.
struct gradient_bucket {
  std::size_t first = 0;
  std::size_t end = 0;
  std::int64_t numel = 0;
};

/// The buckets of parameters of `numels` elements, in order: whole tensors,
/// a bucket closed before it would exceed `bucket_bytes` of fp32 (a tensor
/// larger than that is a bucket of its own).
std::vector<gradient_bucket>
cut_buckets(const std::vector<std::int64_t>& numels,
            std::uint64_t bucket_bytes);

} // namespace h2::scheduler
