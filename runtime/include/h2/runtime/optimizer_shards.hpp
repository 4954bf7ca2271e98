// ZeRO-1's layout (docs/planner.md, "Sharded optimizer state"): the buckets
// a reduction group's gradients are cut into, and the elements of each
// parameter whose AdamW moments a member of the group keeps. Pure
// arithmetic: every member computes the same buckets and shares from the
// same parameter sizes.
#pragma once

#include "h2/scheduler/buckets.hpp"

#include <cstdint>
#include <vector>

namespace h2::runtime {

/// What the all-reduce and ZeRO-1 both cut (the cost model prices the
/// same buckets).
using scheduler::cut_buckets;
using scheduler::gradient_bucket;

/// Elements [offset, offset + length) of one parameter, flattened.
struct parameter_share {
  std::int64_t offset = 0;
  std::int64_t length = 0;

  bool operator==(const parameter_share&) const = default;
};

/// Of each parameter of `numels`, the elements member `rank` of a ring of
/// `size` keeps the moments of: its ring share of each bucket
/// (transport::owned_share), which it holds the finished gradient sum of
/// after the reduce-scatter. Lengths may be 0; over the ring's members the
/// shares of a parameter tile it exactly.
std::vector<parameter_share>
owned_shares(const std::vector<std::int64_t>& numels,
             std::uint64_t bucket_bytes, int rank, int size);

} // namespace h2::runtime
