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

namespace {

/// The share `c` of `data` split into `size` near-equal contiguous shares.
at::Tensor share(const at::Tensor& data, int c, int size) {
  const std::int64_t n = data.numel();
  const std::int64_t base = n / size, extra = n % size;
  const std::int64_t begin = c * base + std::min<std::int64_t>(c, extra);
  const std::int64_t len = base + (c < extra ? 1 : 0);
  return data.narrow(0, begin, len);
}

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

} // namespace

void ring_allreduce(at::Tensor& data, int rank, int size,
                    const allreduce_options& options, ring_io& io) {
  H2_ENFORCE(data.is_contiguous() && data.scalar_type() == at::kFloat &&
               data.dim() == 1,
             "ring_allreduce expects a flat contiguous fp32 tensor");
  H2_ENFORCE(size >= 1 && rank >= 0 && rank < size, "rank=", rank,
             " size=", size);
  H2_ENFORCE(options.wire_dtype == at::kFloat ||
               options.wire_dtype == at::kBFloat16,
             "wire dtype must be fp32 or bf16");
  if (options.op == reduce_op::weighted_average)
    data.mul_(options.weight / options.total_weight);
  if (size == 1)
    return;
  auto to_wire = [&](const at::Tensor& t) {
    return options.wire_dtype == at::kFloat ? t.clone()
                                            : t.to(options.wire_dtype);
  };
  int ring_step = 0;
  // Reduce-scatter: after size - 1 steps member r holds the whole sum of
  // share (r + 1) mod size.
  for (int s = 0; s < size - 1; ++s, ++ring_step) {
    const auto tag =
      collective_tag(options.step, options.group, options.bucket, ring_step);
    io.send_next(tag, to_wire(share(data, mod(rank - s, size), size)));
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
    at::Tensor owned = share(data, mod(rank + 1, size), size);
    owned.copy_(owned.to(options.wire_dtype).to(at::kFloat));
  }
  // All-gather: pass the finished shares around the ring.
  for (int s = 0; s < size - 1; ++s, ++ring_step) {
    const auto tag =
      collective_tag(options.step, options.group, options.bucket, ring_step);
    io.send_next(tag, to_wire(share(data, mod(rank + 1 - s, size), size)));
    at::Tensor in = io.recv_prev(tag);
    at::Tensor mine = share(data, mod(rank - s, size), size);
    H2_ENFORCE(in.numel() == mine.numel(), "ring peer sent ", in.numel(),
               " values, expected ", mine.numel());
    mine.copy_(in.to(at::kFloat));
  }
}

} // namespace h2::transport
