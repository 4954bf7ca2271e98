#include "h2/scheduler/cost_model.hpp"

#include "h2/core/error.hpp"
#include "h2/scheduler/buckets.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace h2::scheduler {

namespace {

/// Bytes of the causal mask a block keeps (bool [seq_len, seq_len]).
double mask_bytes(const gpt_config& cfg) {
  return static_cast<double>(cfg.seq_len) * cfg.seq_len;
}

/// A llama block's activations and working memory, as the runtime's
/// accounting measured them (tests/scheduler/cost_model_test.cpp): in fp32
/// 12 d + 4 d_ff + heads x T floats per token (RMSNorm inputs and outputs,
/// q, k and v, the keys and values repeated to every query head, the
/// attention output, the SwiGLU MLP's gate, up, SiLU and product, the
/// softmax probabilities); under bf16 autocast the products' operands are
/// bf16 copies and each weight matrix keeps a bf16 copy until the backward.
void llama_block_memory(const gpt_config& cfg, double tokens, bool bf16,
                        double grad_temp, layer_memory& m) {
  const double dm = cfg.d_model, ff = cfg.d_ff, h = cfg.n_head, t = cfg.seq_len,
               kv = static_cast<double>(cfg.kv_heads()) * cfg.head_dim();
  const double matrices = 2 * dm * dm + 2 * dm * kv + 3 * dm * ff;
  m.activation_bytes =
    bf16 ? tokens * (43 * dm + 8 * ff + 2 * h * t + 8) + 2 * matrices
         : tokens * (4 * (12 * dm + 4 * ff + h * t) + 8);
  m.working_bytes = grad_temp * std::max(dm * dm, dm * ff) +
                    tokens * (4 * (3 * ff + 2 * dm) + 8 * h * t);
}

} // namespace

// The per-token counts below follow the tensors autograd saves in
// model/layers.cpp, checked against the runtime's memory accounting
// (docs/planner.md, "Memory"): in fp32 a block keeps LN1 output, qkv (3d),
// softmax probabilities (h x T per token), attention output, the residual,
// LN2 output, fc1 output and GELU output (2 x d_ff), its own output and the
// LayerNorm statistics. Under bf16 autocast the matrix products' inputs and
// outputs are bf16 copies, the residual stream stays fp32, and every weight
// matrix is cast to a bf16 copy per forward that autograd keeps until the
// micro-batch's backward.
layer_memory layer_memory_of(const gpt_config& cfg, layer_kind kind,
                             int micro_batch_size, dtype d) {
  const double tokens = static_cast<double>(micro_batch_size) * cfg.seq_len;
  const double dm = cfg.d_model, ff = cfg.d_ff, v = cfg.vocab_size,
               h = cfg.n_head, t = cfg.seq_len;
  const bool bf16 = d != dtype::fp32;
  // A weight gradient computed while the previous one is accumulated; under
  // autocast it first exists in the compute dtype, then in fp32.
  const double grad_temp = bf16 ? 6.0 : 4.0;
  layer_memory m;
  // Layer parameters need the layer index, not just its kind; any index of
  // the kind will do.
  int index = kind == layer_kind::embedding ? 0
              : kind == layer_kind::block   ? 1
                                            : cfg.n_layer + 1;
  m.parameters = layer_parameters(cfg, index);
  m.static_bytes = 16.0 * static_cast<double>(m.parameters);
  double largest = 0; // elements of the largest tensor
  switch (kind) {
    case layer_kind::embedding:
      m.activation_bytes = tokens * 4 * dm;
      m.working_bytes = 4 * v * dm + 4 * t * dm + tokens * 4 * dm;
      largest = v * dm;
      break;
    case layer_kind::block: {
      m.static_bytes += mask_bytes(cfg);
      // The softmax probabilities, in the compute dtype.
      m.attention_bytes = tokens * (bf16 ? 2 : 4) * h * t;
      if (cfg.family == model_family::llama) {
        llama_block_memory(cfg, tokens, bf16, grad_temp, m);
        largest = std::max(dm * dm, dm * ff);
        break;
      }
      const double matrices = 4 * dm * dm + 2 * dm * ff;
      m.activation_bytes =
        bf16 ? tokens * (20 * dm + 4 * ff + 2 * h * t + 16) + 2 * matrices
             : tokens * (32 * dm + 8 * ff + 4 * h * t + 16);
      largest = std::max(3 * dm * dm, dm * ff);
      m.working_bytes =
        grad_temp * largest + tokens * (4 * (ff + 2 * dm) + 8 * h * t);
      break;
    }
    case layer_kind::head:
      // llama's RMSNorm keeps its fp32 input, its normalised output and the
      // product with its gain.
      if (cfg.family == model_family::llama)
        m.activation_bytes = bf16 ? tokens * (10 * dm + 4 + 4 * v) + 2 * v * dm
                                  : tokens * (12 * dm + 4 + 4 * v);
      else
        m.activation_bytes = bf16 ? tokens * (2 * dm + 8 + 4 * v) + 2 * v * dm
                                  : tokens * (4 * dm + 8 + 4 * v);
      largest = v * dm;
      m.working_bytes = grad_temp * largest + tokens * 4 * (2 * v + 2 * dm);
      break;
  }
  // AdamW: sqrt(v), its quotient and the update's temporaries, fp32.
  m.optimizer_working_bytes = 16 * largest;
  const bool tied_table = cfg.tie_embeddings && kind != layer_kind::block;
  m.shardable_bytes =
    8.0 * (static_cast<double>(m.parameters) - (tied_table ? v * dm : 0.0));
  return m;
}

double boundary_bytes(const gpt_config& cfg, int micro_batch_size) {
  return 4.0 * micro_batch_size * cfg.seq_len * cfg.d_model;
}

double batch_bytes(const gpt_config& cfg, int micro_batch_size) {
  return 16.0 * micro_batch_size * cfg.seq_len;
}

std::vector<std::int64_t> parameter_tensors(const gpt_config& cfg,
                                            layer_kind kind) {
  const std::int64_t d = cfg.d_model, f = cfg.d_ff, v = cfg.vocab_size,
                     t = cfg.seq_len;
  if (cfg.family == model_family::llama) {
    const std::int64_t kv = std::int64_t{cfg.kv_heads()} * cfg.head_dim();
    switch (kind) {
      case layer_kind::embedding:
        return {v * d}; // wte
      case layer_kind::block:
        // attn_norm, q, k, v, o, mlp_norm, gate, up, down
        return {d, d * d, kv * d, kv * d, d * d, d, f * d, f * d, d * f};
      case layer_kind::head:
        return {d, v * d}; // norm, lm_head
    }
  }
  switch (kind) {
    case layer_kind::embedding:
      return {v * d, t * d}; // wte, wpe
    case layer_kind::block:
      // ln1 (w, b), qkv (w, b), proj (w, b), ln2 (w, b), fc1 (w, b), fc2
      // (w, b)
      return {d, d, 3 * d * d, 3 * d, d * d, d, d, d, f * d, f, d * f, d};
    case layer_kind::head:
      return {d, d, v * d}; // ln_f (w, b), lm_head
  }
  return {};
}

stage_layers stage_layers::of(const gpt_config& cfg, int first_layer,
                              int end_layer) {
  H2_ENFORCE(0 <= first_layer && first_layer < end_layer &&
               end_layer <= cfg.num_layers(),
             "first=", first_layer, " end=", end_layer,
             " layers=", cfg.num_layers());
  stage_layers s;
  s.embedding = first_layer == 0;
  s.head = end_layer == cfg.num_layers();
  s.blocks = end_layer - first_layer - (s.embedding ? 1 : 0) - (s.head ? 1 : 0);
  return s;
}

stage_cost stage_cost::sharded(int replicas) const noexcept {
  stage_cost c = *this;
  if (replicas < 2)
    return c;
  const double kept_away = shardable_bytes * (replicas - 1) / replicas;
  // The update runs over the moments the chip keeps (2 x gradient bytes
  // without sharding).
  const double moments = 2 * gradient_bytes;
  c.static_bytes -= kept_away;
  if (moments > 0)
    c.optimizer_seconds *= (moments - kept_away) / moments;
  c.shardable_bytes -= kept_away;
  return c;
}

double stage_cost::peak_bytes(int in_flight, bool reduced) const noexcept {
  return static_bytes + std::max({held_bytes * in_flight + working_bytes,
                                  optimizer_working_bytes,
                                  reduced ? reduction_working_bytes : 0.0});
}

std::string_view to_string(recompute_levels l) noexcept {
  switch (l) {
    case recompute_levels::none:
      return "none";
    case recompute_levels::full:
      return "full";
    case recompute_levels::selective:
      return "selective";
  }
  return "?";
}

std::optional<recompute_levels>
parse_recompute_levels(std::string_view s) noexcept {
  for (auto l : {recompute_levels::none, recompute_levels::full,
                 recompute_levels::selective})
    if (to_string(l) == s)
      return l;
  return std::nullopt;
}

stage_cost stage_coefficients::cost(const stage_layers& s,
                                    const recompute_policy& rc) const noexcept {
  stage_cost c;
  const double nb = s.blocks;
  // Forward and backward times are sums over the stage's layers, as the
  // runtime charges them.
  double fwd = nb * block.forward_seconds;
  double bwd = nb * block.backward_seconds;
  double input = nb * block.input_seconds;
  double weight = nb * block.weight_seconds;
  double opt = nb * optimizer_block;
  double stat = nb * memory_block.static_bytes;
  double act = nb * memory_block.activation_bytes;
  double work = nb > 0 ? memory_block.working_bytes : 0.0;
  double opt_work = nb > 0 ? memory_block.optimizer_working_bytes : 0.0;
  double params = nb * static_cast<double>(memory_block.parameters);
  double shardable = nb * memory_block.shardable_bytes;
  auto add = [&](const layer_timing& t, double o, const layer_memory& m) {
    fwd += t.forward_seconds;
    bwd += t.backward_seconds;
    input += t.input_seconds;
    weight += t.weight_seconds;
    opt += o;
    stat += m.static_bytes;
    act += m.activation_bytes;
    work = std::max(work, m.working_bytes);
    opt_work = std::max(opt_work, m.optimizer_working_bytes);
    params += static_cast<double>(m.parameters);
    shardable += m.shardable_bytes;
  };
  if (s.embedding)
    add(embedding, optimizer_embedding, memory_embedding);
  if (s.head)
    add(head, optimizer_head, memory_head);
  const double input_bytes = s.embedding ? 0.0 : boundary_bytes;
  const double batch = s.embedding || s.head ? batch_bytes : 0.0;
  // What the recomputation runs again (B runs it), what it does not keep,
  // and what it rebuilds at one backward on top of the working set.
  double again = 0, dropped = 0, rebuilt = 0;
  recompute_policy used = rc;
  if (rc.full) {
    used = recompute_policy::whole();
    again = fwd;
    dropped = act;
    rebuilt = act;
  } else {
    used.blocks = std::min(rc.blocks, s.blocks);
    const double whole = used.blocks, cores = rc.attention ? nb - whole : 0;
    used.attention = rc.attention && cores > 0;
    again = whole * block.forward_seconds + cores * block.attention_seconds;
    // A block recomputed whole still keeps its output (the next layer's
    // input).
    dropped = whole * (memory_block.activation_bytes - boundary_bytes) +
              cores * memory_block.attention_bytes;
    // One backward at a time: a whole block's activations or a core's
    // probabilities.
    rebuilt = std::max(whole > 0 ? memory_block.activation_bytes : 0.0,
                       cores > 0 ? memory_block.attention_bytes : 0.0);
  }
  c.forward_seconds = fwd;
  c.backward_seconds = bwd + again;
  c.input_seconds = input + again;
  c.weight_seconds = weight;
  c.optimizer_seconds = opt;
  c.static_bytes = stat;
  c.recompute = used;
  c.held_bytes = input_bytes + batch + act - dropped;
  c.working_bytes = work + rebuilt;
  c.optimizer_working_bytes = opt_work;
  c.gradient_bytes = 4 * params;
  c.shardable_bytes = shardable;
  // Buckets hold whole tensors: one larger than the limit is a bucket of
  // its own (AdamW's working set is 16 bytes per element of the largest).
  const double largest_tensor = 4 * opt_work / 16;
  c.reduction_working_bytes =
    2 * std::min(c.gradient_bytes, std::max(bucket_bytes, largest_tensor));
  return c;
}

std::optional<stage_cost>
stage_coefficients::fitting(const stage_layers& s, int in_flight,
                            double capacity, recompute_levels levels,
                            bool reduced, int zero1_replicas) const {
  std::optional<stage_cost> best;
  auto consider = [&](const recompute_policy& p) {
    stage_cost c = cost(s, p).sharded(zero1_replicas);
    if (c.peak_bytes(in_flight, reduced) <= capacity &&
        (!best || c.backward_seconds < best->backward_seconds))
      best = c;
  };
  consider(recompute_policy::none());
  if (best || levels == recompute_levels::none)
    return best;
  if (levels == recompute_levels::selective && s.blocks > 0) {
    // The fewest whole blocks that fit, alone or with the other blocks'
    // attention cores: held bytes fall by the same amount per block.
    for (bool attention : {false, true}) {
      recompute_policy p{false, 0, attention};
      const stage_cost base = cost(s, p).sharded(zero1_replicas);
      const double per_block =
        (memory_block.activation_bytes - boundary_bytes -
         (attention ? memory_block.attention_bytes : 0.0)) *
        in_flight;
      // Recomputing any block rebuilds one block's activations in the
      // working set instead of one core's probabilities.
      const double excess = base.peak_bytes(in_flight, reduced) - capacity +
                            memory_block.activation_bytes -
                            (attention ? memory_block.attention_bytes : 0.0);
      int k = 0;
      if (base.peak_bytes(in_flight, reduced) > capacity && per_block > 0)
        k = std::max(1, static_cast<int>(std::ceil(excess / per_block)));
      k = std::clamp(k, 0, s.blocks);
      for (int tries = 0; tries < 2 && k <= s.blocks; ++tries, ++k)
        consider({false, k, attention});
    }
  }
  consider(recompute_policy::whole());
  return best;
}

cost_model::cost_model(const job_config& job, chip_measurements& measurements)
    : job_(&job), cache_(measurements, job.model) {
}

double cost_model::capacity_bytes(const chip_spec& chip) const {
  if (chip.backend == device_backend::emulated)
    return std::floor(static_cast<double>(chip.profile.memory_bytes) *
                      job_->emulation.memory_scale);
  if (is_gpu(chip))
    return cache_.capacity_bytes(chip).value_or(
      std::numeric_limits<double>::infinity());
  if (chip.profile.memory_bytes > 0)
    return static_cast<double>(chip.profile.memory_bytes);
  return std::numeric_limits<double>::infinity();
}

const stage_coefficients& cost_model::coefficients(const chip_spec& chip,
                                                   int micro_batch_size) {
  auto key = std::make_pair(chip_kind_key(chip), micro_batch_size);
  auto it = coefficients_.find(key);
  if (it != coefficients_.end())
    return it->second;
  const auto& cfg = job_->model;
  stage_coefficients c;
  c.embedding = cache_.layer(chip, layer_kind::embedding, micro_batch_size);
  c.block = cache_.layer(chip, layer_kind::block, micro_batch_size);
  c.head = cache_.layer(chip, layer_kind::head, micro_batch_size);
  c.optimizer_embedding = cache_.optimizer(chip, layer_kind::embedding);
  c.optimizer_block = cache_.optimizer(chip, layer_kind::block);
  c.optimizer_head = cache_.optimizer(chip, layer_kind::head);
  const dtype d = chip.compute_dtype;
  c.memory_embedding =
    layer_memory_of(cfg, layer_kind::embedding, micro_batch_size, d);
  c.memory_block = layer_memory_of(cfg, layer_kind::block, micro_batch_size, d);
  c.memory_head = layer_memory_of(cfg, layer_kind::head, micro_batch_size, d);
  c.boundary_bytes = scheduler::boundary_bytes(cfg, micro_batch_size);
  c.batch_bytes = scheduler::batch_bytes(cfg, micro_batch_size);
  c.bucket_bytes = static_cast<double>(job_->transport.bucket_bytes);
  return coefficients_.emplace(key, c).first->second;
}

stage_cost cost_model::stage(const chip_spec& chip, int first_layer,
                             int end_layer, int micro_batch_size,
                             const recompute_policy& recompute) {
  return coefficients(chip, micro_batch_size)
    .cost(stage_layers::of(job_->model, first_layer, end_layer), recompute);
}

double cost_model::boundary_seconds(const chip_spec& from, const chip_spec& to,
                                    int micro_batch_size) const {
  return link(from, to).seconds(
    scheduler::boundary_bytes(job_->model, micro_batch_size));
}

std::vector<link_figures>
cost_model::ring_links(const std::vector<const chip_spec*>& ring) const {
  std::vector<link_figures> out;
  const std::size_t r = ring.size();
  for (std::size_t i = 0; i < r && r >= 2; ++i)
    out.push_back(link(*ring[(i + r - 1) % r], *ring[i]));
  return out;
}

std::vector<gradient_bucket>
cut_buckets(const std::vector<std::int64_t>& numels,
            std::uint64_t bucket_bytes) {
  std::vector<gradient_bucket> out;
  for (std::size_t i = 0; i < numels.size();) {
    gradient_bucket b{i, i, 0};
    std::uint64_t bytes = 0;
    do {
      bytes += static_cast<std::uint64_t>(numels[i]) * 4;
      b.numel += numels[i];
      ++i;
    } while (i < numels.size() &&
             bytes + static_cast<std::uint64_t>(numels[i]) * 4 <= bucket_bytes);
    b.end = i;
    out.push_back(b);
  }
  return out;
}

std::vector<double> cost_model::buckets(const stage_layers& layers) const {
  const auto& cfg = job_->model;
  std::vector<std::int64_t> numels;
  numels.reserve(16 * (static_cast<std::size_t>(layers.blocks) + 2));
  auto add = [&](layer_kind kind) {
    for (std::int64_t n : parameter_tensors(cfg, kind))
      numels.push_back(n);
  };
  if (layers.embedding)
    add(layer_kind::embedding);
  for (int i = 0; i < layers.blocks; ++i)
    add(layer_kind::block);
  if (layers.head)
    add(layer_kind::head);
  std::vector<double> out;
  for (const auto& b : cut_buckets(numels, job_->transport.bucket_bytes))
    out.push_back(4.0 * static_cast<double>(b.numel));
  return out;
}

double cost_model::allreduce_seconds(const std::vector<link_figures>& links,
                                     const std::vector<double>& buckets,
                                     bool zero1) const {
  const std::size_t r = links.size();
  if (r < 2)
    return 0;
  const double wire = job_->transport.reduce_dtype == dtype::fp32 ? 1.0 : 0.5;
  // ZeRO-1 gathers fp32 parameters in the second half.
  const double gather = zero1 ? 1.0 : wire;
  auto ring_step = [&](double bytes) {
    double step = 0;
    for (const auto& e : links)
      step = std::max(step, e.seconds(bytes / static_cast<double>(r)));
    return static_cast<double>(r - 1) * step;
  };
  double total = 0;
  for (double b : buckets)
    total += ring_step(b * wire) + ring_step(b * gather);
  return total;
}

double cost_model::allreduce_seconds(const std::vector<const chip_spec*>& ring,
                                     int first_layer, int end_layer,
                                     bool zero1) const {
  if (ring.size() < 2)
    return 0;
  return allreduce_seconds(
    ring_links(ring),
    buckets(stage_layers::of(job_->model, first_layer, end_layer)), zero1);
}

} // namespace h2::scheduler
