// Collectives over channels: the ring all-reduce that sums the gradients of
// one layer group across data-parallel replicas (docs/transport.md,
// Collectives: gradients of the same layer are all-reduced across replicas,
// weighted by their tokens).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace h2::transport {

enum class reduce_op {
  sum,              ///< plain sum
  weighted_average, ///< sum of weight_r x data_r / total weight
};

/// How a ring member moves tensors: the caller's own send and receive, so
/// they stamp clocks and account memory like every other message.
struct ring_io {
  std::function<void(std::uint64_t tag, const at::Tensor& t)> send_next;
  std::function<at::Tensor(std::uint64_t tag)> recv_prev;
  /// Called with the bytes of every local reduction (an add of two chunks),
  /// so the caller can charge its time; may be empty.
  std::function<void(std::uint64_t bytes)> reduced;
};

struct allreduce_options {
  reduce_op op = reduce_op::sum;
  double weight = 1;       ///< this member's weight (weighted_average)
  double total_weight = 1; ///< the sum of every member's weight
  /// What crosses the wire: at::kFloat, or at::kBFloat16 (half the bytes;
  /// sums still accumulate in fp32, and every member ends with the same
  /// bf16-rounded result).
  at::ScalarType wire_dtype = at::kFloat;
  std::int64_t step = 0; ///< for the tags
  int group = 0;         ///< which reduction group (tags)
  int bucket = 0;        ///< which bucket of the group (tags)
};

/// The tag of ring step `ring_step` of bucket `bucket` of reduction group
/// `group` in `step`: tag_kind::control, then 12 bits of ring step, 10 of
/// bucket, 12 of group and 28 of step (enforced).
std::uint64_t collective_tag(std::int64_t step, int group, int bucket,
                             int ring_step);

/// The group number of collective_tag that the exchange of a tied
/// embedding's gradients uses (between a replica's embedding and head
/// chips, which no reduction ring joins).
inline constexpr int tied_embedding_group = 4095;

/// Elements [begin, begin + length) of a flat tensor of `numel` elements:
/// share `c` of `size` near-equal contiguous shares (the first numel mod
/// size shares one longer), as the ring cuts its data.
struct ring_share {
  std::int64_t begin = 0;
  std::int64_t length = 0;
};
ring_share ring_share_of(std::int64_t numel, int c, int size);

/// The share member `rank` of `size` holds the whole sum of after
/// ring_reduce_scatter, and passes on first in ring_allgather.
int owned_share(int rank, int size) noexcept;

/// The first half of ring_allreduce, in place: after it member `rank` holds
/// the finished sum (weighted, and rounded to the wire dtype like the
/// all-reduce's) of share owned_share(rank, size) of `data`; the other
/// shares hold partial sums. Ring steps 0 to size - 2 of the tags.
void ring_reduce_scatter(at::Tensor& data, int rank, int size,
                         const allreduce_options& options, ring_io& io);

/// The second half of ring_allreduce, in place: every member passes on
/// share owned_share(rank, size) of `data` until all hold every member's
/// share. Ring steps first_ring_step to first_ring_step + size - 2 of the
/// tags (ring_allreduce: size - 1).
void ring_allgather(at::Tensor& data, int rank, int size,
                    const allreduce_options& options, ring_io& io,
                    int first_ring_step);

/// Ring all-reduce, in place, of the contiguous fp32 tensor `data` among
/// `size` members; this one is `rank`. Reduce-scatter, then all-gather:
/// 2 (size - 1) steps, each moving a 1/size share to the next member. Each
/// share is summed by one member in a fixed order and then copied to all, so
/// every member ends with bitwise the same result (ring_reduce_scatter,
/// then ring_allgather). Throws whatever `io` throws (a transport_error
/// when a neighbour is gone).
void ring_allreduce(at::Tensor& data, int rank, int size,
                    const allreduce_options& options, ring_io& io);

} // namespace h2::transport
