#include "h2/runtime/optimizer_shards.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/collectives.hpp"

#include <algorithm>

namespace h2::runtime {

std::vector<parameter_share>
owned_shares(const std::vector<std::int64_t>& numels,
             std::uint64_t bucket_bytes, int rank, int size) {
  H2_ENFORCE(size >= 1 && rank >= 0 && rank < size, "rank=", rank,
             " size=", size);
  std::vector<parameter_share> out(numels.size());
  for (const auto& b : cut_buckets(numels, bucket_bytes)) {
    const auto owned = transport::ring_share_of(
      b.numel, transport::owned_share(rank, size), size);
    const std::int64_t lo = owned.begin, hi = owned.begin + owned.length;
    std::int64_t at = 0; // the parameter's first element in the bucket
    for (std::size_t i = b.first; i < b.end; ++i) {
      const std::int64_t begin = std::max(lo, at),
                         end = std::min(hi, at + numels[i]);
      out[i] = end > begin ? parameter_share{begin - at, end - begin}
                           : parameter_share{0, 0};
      at += numels[i];
    }
  }
  return out;
}

} // namespace h2::runtime
