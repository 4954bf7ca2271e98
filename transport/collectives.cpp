#include "h2/transport/collectives.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/tags.hpp"

#include <ATen/ops/empty.h>

namespace h2::transport {

std::uint64_t collective_tag(std::int64_t step, int group, int bucket,
                             int ring_step) {
  H2_ENFORCE(step >= 0 && step < (std::int64_t{1} << 28) && group >= 0 &&
               group < 4096 && bucket >= 0 && bucket < 1024 && ring_step >= 0 &&
               ring_step < 4096,
             "step=", step, " group=", group, " bucket=", bucket,
             " ring_step=", ring_step);
  return static_cast<std::uint64_t>(tag_kind::control) |
         (static_cast<std::uint64_t>(ring_step) << 2) |
         (static_cast<std::uint64_t>(bucket) << 14) |
         (static_cast<std::uint64_t>(group) << 24) |
         (static_cast<std::uint64_t>(step) << 36);
}

ring_share ring_share_of(std::int64_t numel, int c, int size) {
  const std::int64_t base = numel / size, extra = numel % size;
  return {c * base + std::min<std::int64_t>(c, extra),
          base + (c < extra ? 1 : 0)};
}

int owned_share(int rank, int size) noexcept {
  return (rank + 1) % size;
}

namespace {

/// The share `c` of `data` split into `size` shares (ring_share_of).
at::Tensor share(const at::Tensor& data, int c, int size) {
  const auto s = ring_share_of(data.numel(), c, size);
  return data.narrow(0, s.begin, s.length);
}

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

void check_ring(const at::Tensor& data, int rank, int size,
                const allreduce_options& options) {
  H2_ENFORCE(data.is_contiguous() && data.scalar_type() == at::kFloat &&
               data.dim() == 1,
             "ring collectives expect a flat contiguous fp32 tensor");
  H2_ENFORCE(size >= 1 && rank >= 0 && rank < size, "rank=", rank,
             " size=", size);
  H2_ENFORCE(options.wire_dtype == at::kFloat ||
               options.wire_dtype == at::kBFloat16,
             "wire dtype must be fp32 or bf16");
}

at::Tensor to_wire(const at::Tensor& t, at::ScalarType wire) {
  return wire == at::kFloat ? t.clone() : t.to(wire);
}

} // namespace

void ring_reduce_scatter(at::Tensor& data, int rank, int size,
                         const allreduce_options& options, ring_io& io) {
  check_ring(data, rank, size, options);
  if (options.op == reduce_op::weighted_average)
    data.mul_(options.weight / options.total_weight);
  if (size == 1)
    return;
  // After size - 1 steps member r holds the whole sum of share
  // owned_share(r, size).
  for (int s = 0; s < size - 1; ++s) {
    const auto tag =
      collective_tag(options.step, options.group, options.bucket, s);
    io.send_next(
      tag, to_wire(share(data, mod(rank - s, size), size), options.wire_dtype));
    at::Tensor in = io.recv_prev(tag);
    at::Tensor mine = share(data, mod(rank - s - 1, size), size);
    H2_ENFORCE(in.numel() == mine.numel(), "ring peer sent ", in.numel(),
               " values, expected ", mine.numel());
    mine.add_(in.to(at::kFloat));
    if (io.reduced)
      io.reduced(static_cast<std::uint64_t>(mine.numel()) * 4);
  }
  if (options.wire_dtype != at::kFloat) {
    // The owner rounds its share as the others will receive it.
    at::Tensor owned = share(data, owned_share(rank, size), size);
    owned.copy_(owned.to(options.wire_dtype).to(at::kFloat));
  }
}

void ring_allgather(at::Tensor& data, int rank, int size,
                    const allreduce_options& options, ring_io& io,
                    int first_ring_step) {
  check_ring(data, rank, size, options);
  // Pass the finished shares around the ring.
  for (int s = 0; s < size - 1; ++s) {
    const auto tag = collective_tag(options.step, options.group, options.bucket,
                                    first_ring_step + s);
    io.send_next(tag, to_wire(share(data, mod(rank + 1 - s, size), size),
                              options.wire_dtype));
    at::Tensor in = io.recv_prev(tag);
    at::Tensor mine = share(data, mod(rank - s, size), size);
    H2_ENFORCE(in.numel() == mine.numel(), "ring peer sent ", in.numel(),
               " values, expected ", mine.numel());
    mine.copy_(in.to(at::kFloat));
  }
}

void ring_allreduce(at::Tensor& data, int rank, int size,
                    const allreduce_options& options, ring_io& io) {
  ring_reduce_scatter(data, rank, size, options, io);
  if (size > 1)
    ring_allgather(data, rank, size, options, io, size - 1);
}

} // namespace h2::transport
