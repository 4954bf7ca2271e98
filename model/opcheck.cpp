#include "h2/model/opcheck.hpp"

#include "h2/core/error.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/layers.hpp"
#include "h2/model/ops.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

namespace h2::model {

namespace {

/// One input of an operator, drawn on the host.
struct input {
  std::string name;
  at::Tensor host;            ///< fp32 or int64
  bool differentiable = true; ///< floating inputs get a gradient
};

/// An operator's check: its inputs, what it computes from them, and the
/// shape of its output.
struct op_case {
  std::string name;
  bool fp64_reference = false;
  std::vector<input> inputs;
  std::function<at::Tensor(const std::vector<at::Tensor>&)> forward;
  std::vector<std::int64_t> out_shape;
};

/// Draws the inputs of every check in one fixed order.
class draws {
public:
  explicit draws(std::uint64_t seed)
      : gen_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

  at::Tensor normal(at::IntArrayRef shape, double std, double mean = 0) {
    return at::randn(shape, gen_, at::TensorOptions(at::kFloat)) * std + mean;
  }

  at::Tensor tokens(at::IntArrayRef shape, std::int64_t vocab) {
    return at::randint(vocab, shape, gen_, at::TensorOptions(at::kLong));
  }

private:
  at::Generator gen_;
};

/// Key/value heads of the grouped-query check: the model's when it groups
/// its heads, else the fewest that still group them (one).
std::int64_t gqa_heads(const gpt_config& g) {
  return g.kv_heads() < g.n_head ? g.kv_heads() : 1;
}

/// The checks of the gpt2 family's operators, in their draw order.
void add_gpt2_op_cases(const opcheck_options& o, draws& d,
                       std::vector<op_case>& out) {
  const auto& g = o.shapes;
  const std::int64_t b = o.micro_batch, t = g.seq_len, m = g.d_model,
                     h = g.n_head, hd = g.d_model / g.n_head, f = g.d_ff,
                     v = g.vocab_size;
  // Activations as the model sees them: N(0, 1) after a LayerNorm, weights
  // N(0, 0.02) (GPT-2's initialisation).
  out.push_back({"embedding",
                 false,
                 {{"wte", d.normal({v, m}, 0.02)},
                  {"wpe", d.normal({t, m}, 0.02)},
                  {"tokens", d.tokens({b, t}, v), false}},
                 [](const std::vector<at::Tensor>& x) {
                   return ops::embedding(x[0], x[1], x[2]);
                 },
                 {b, t, m}});
  out.push_back({"layer_norm",
                 true,
                 {{"x", d.normal({b, t, m}, 1)},
                  {"weight", d.normal({m}, 0.1, 1)},
                  {"bias", d.normal({m}, 0.1)}},
                 [eps = g.norm_eps](const std::vector<at::Tensor>& x) {
                   return ops::layer_norm(x[0], x[1], x[2], eps);
                 },
                 {b, t, m}});
  out.push_back({"linear",
                 true,
                 {{"x", d.normal({b, t, m}, 1)},
                  {"weight", d.normal({f, m}, 0.02)},
                  {"bias", d.normal({f}, 0.02)}},
                 [](const std::vector<at::Tensor>& x) {
                   return ops::linear(x[0], x[1], x[2]);
                 },
                 {b, t, f}});
  out.push_back({"attention",
                 true,
                 {{"q", d.normal({b, h, t, hd}, 1)},
                  {"k", d.normal({b, h, t, hd}, 1)},
                  {"v", d.normal({b, h, t, hd}, 1)}},
                 [t](const std::vector<at::Tensor>& x) {
                   return ops::attention(x[0], x[1], x[2],
                                         ops::causal_mask(t, x[0].device()));
                 },
                 {b, h, t, hd}});
  out.push_back(
    {"gelu",
     false,
     {{"x", d.normal({b, t, f}, 1)}},
     [](const std::vector<at::Tensor>& x) { return ops::gelu(x[0]); },
     {b, t, f}});
  out.push_back(
    {"softmax",
     true,
     {{"x", d.normal({b, h, t, t}, 1)}},
     [](const std::vector<at::Tensor>& x) { return ops::softmax(x[0]); },
     {b, h, t, t}});
}

/// The checks of the llama family's operators (RMSNorm, RoPE, SwiGLU,
/// grouped-query attention), in their draw order.
void add_llama_op_cases(const opcheck_options& o, draws& d,
                        std::vector<op_case>& out) {
  const auto& g = o.shapes;
  const std::int64_t b = o.micro_batch, t = g.seq_len, m = g.d_model,
                     h = g.n_head, hd = g.d_model / g.n_head, f = g.d_ff,
                     kv = gqa_heads(g);
  out.push_back(
    {"rms_norm",
     true,
     {{"x", d.normal({b, t, m}, 1)}, {"weight", d.normal({m}, 0.1, 1)}},
     [eps = g.norm_eps](const std::vector<at::Tensor>& x) {
       return ops::rms_norm(x[0], x[1], eps);
     },
     {b, t, m}});
  {
    // The tables are constants, as in the blocks: only x is differentiated.
    const auto [cos, sin] = ops::rope_tables(t, hd, g.rope_theta, c10::kCPU);
    out.push_back({"rope",
                   false,
                   {{"x", d.normal({b, h, t, hd}, 1)},
                    {"cos", cos, false},
                    {"sin", sin, false}},
                   [](const std::vector<at::Tensor>& x) {
                     return ops::rope(x[0], x[1], x[2]);
                   },
                   {b, h, t, hd}});
  }
  out.push_back(
    {"swiglu",
     false,
     {{"gate", d.normal({b, t, f}, 1)}, {"up", d.normal({b, t, f}, 1)}},
     [](const std::vector<at::Tensor>& x) { return ops::swiglu(x[0], x[1]); },
     {b, t, f}});
  out.push_back({"gqa_attention",
                 true,
                 {{"q", d.normal({b, h, t, hd}, 1)},
                  {"k", d.normal({b, kv, t, hd}, 1)},
                  {"v", d.normal({b, kv, t, hd}, 1)}},
                 [t](const std::vector<at::Tensor>& x) {
                   return ops::attention(x[0], x[1], x[2],
                                         ops::causal_mask(t, x[0].device()));
                 },
                 {b, h, t, hd}});
}

std::vector<op_case> make_cases(const opcheck_options& o, draws& d) {
  const auto& g = o.shapes;
  const std::int64_t b = o.micro_batch, t = g.seq_len, v = g.vocab_size;
  std::vector<op_case> out;
  add_gpt2_op_cases(o, d, out);
  add_llama_op_cases(o, d, out);
  out.push_back({"cross_entropy",
                 true,
                 {{"logits", d.normal({b * t, v}, 1)},
                  {"targets", d.tokens({b * t}, v), false}},
                 [](const std::vector<at::Tensor>& x) {
                   return ops::cross_entropy_sum(x[0], x[1]);
                 },
                 {}});
  return out;
}

/// What one side of a check produced, on the host in fp64.
struct outcome {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  at::ScalarType computed = at::kFloat; ///< of the forward's output
};

std::optional<dtype> dtype_of(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
      return dtype::fp32;
    case at::kBFloat16:
      return dtype::bf16;
    case at::kHalf:
      return dtype::fp16;
    default:
      return std::nullopt;
  }
}

std::string dtype_name(at::ScalarType s) {
  if (s == at::kDouble)
    return "fp64";
  auto d = dtype_of(s);
  return d ? std::string(to_string(*d)) : std::string(c10::toString(s));
}

/// Runs `c` on `device` with floating inputs in `floating` (fp32 on the chip
/// under test, whose autocast picks what it computes in; fp32 or fp64 on
/// the reference), backward with `grad_out`.
outcome run_case(devices::device_context& device, const op_case& c,
                 at::ScalarType floating, bool under_test,
                 const opcheck_options& o, const at::Tensor& grad_out) {
  devices::thread_binding bind(device);
  std::vector<at::Tensor> xs;
  for (const auto& in : c.inputs) {
    auto x = in.differentiable ? in.host.to(floating) : in.host;
    x = device.to_device(x.contiguous()).detach();
    if (in.differentiable)
      x.requires_grad_(true);
    xs.push_back(x);
  }
  at::Tensor y;
  {
    std::optional<devices::compute_scope> scope;
    if (under_test)
      scope.emplace(device);
    y = c.forward(xs);
    if (under_test && o.fault == c.name)
      y = y * 1.05;
  }
  outcome r;
  r.names.push_back("out");
  r.tensors.push_back(y.detach());
  y.backward(device.to_device(grad_out.to(y.scalar_type())));
  for (std::size_t i = 0; i < xs.size(); ++i)
    if (c.inputs[i].differentiable) {
      r.names.push_back("grad " + c.inputs[i].name);
      r.tensors.push_back(xs[i].grad());
    }
  device.synchronize();
  r.computed = y.scalar_type();
  for (auto& t : r.tensors)
    t = device.to_host(t).to(at::kDouble);
  return r;
}

/// One AdamW update from the same state on `device`, in fp32.
outcome run_adamw(devices::device_context& device,
                  const std::vector<at::Tensor>& state, bool under_test,
                  const opcheck_options& o) {
  devices::thread_binding bind(device);
  parameter p;
  p.name = "weight";
  p.decay = true;
  p.value = device.to_device(state[0].clone()).requires_grad_(true);
  p.value.mutable_grad() = device.to_device(state[1].clone());
  p.exp_avg = device.to_device(state[2].clone());
  p.exp_avg_sq = device.to_device(state[3].clone());
  // Step 3: bias corrections that are not 1.
  ops::adamw(p, o.train, o.train.lr, 3, 0.5);
  if (under_test && o.fault == "adamw") {
    at::NoGradGuard no_grad;
    p.value.mul_(1.05);
  }
  device.synchronize();
  outcome r;
  r.names = {"value", "exp_avg", "exp_avg_sq"};
  for (const auto& t : {p.value.detach(), p.exp_avg, p.exp_avg_sq})
    r.tensors.push_back(device.to_host(t).to(at::kDouble));
  return r;
}

opcheck_result compare(const std::string& op, const std::string& tensor,
                       const at::Tensor& d, const at::Tensor& r,
                       const tolerance& tol) {
  opcheck_result out;
  out.op = op;
  out.tensor = tensor;
  out.tol = tol;
  out.elements = r.numel();
  H2_ENFORCE(d.sizes() == r.sizes(), op, " ", tensor, ": shapes differ");
  const auto diff = (d - r).abs();
  const auto mag = r.abs();
  out.max_abs_error = out.elements ? diff.max().item<double>() : 0;
  const auto judged = (mag >= tol.atol).logical_and(mag > 0);
  if (judged.any().item<bool>())
    out.max_rel_error = (diff.masked_select(judged) / mag.masked_select(judged))
                          .max()
                          .item<double>();
  const double dd = d.square().sum().item<double>();
  const double rr = r.square().sum().item<double>();
  out.cosine = dd == 0 && rr == 0
                 ? 1.0
                 : (d * r).sum().item<double>() / std::sqrt(dd * rr);
  // NaN or inf anywhere fails (the comparison is false for NaN).
  out.passed = (diff <= tol.atol + tol.rtol * mag).all().item<bool>();
  return out;
}

} // namespace

tolerance default_tolerance(dtype d) noexcept {
  if (d == dtype::fp32)
    return {1e-5, 1e-5};
  return {1.6e-2, 1.6e-2};
}

const std::vector<std::string>& checked_operators() {
  static const std::vector<std::string> names{
    "embedding", "layer_norm",    "linear",        "attention",
    "gelu",      "softmax",       "rms_norm",      "rope",
    "swiglu",    "gqa_attention", "cross_entropy", "adamw"};
  return names;
}

std::vector<opcheck_result> check_operators(devices::device_context& device,
                                            devices::device_context& reference,
                                            const opcheck_options& o) {
  const auto& known = checked_operators();
  auto check_name = [&](const std::string& key, const std::string& name) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const auto& n : known)
        list += (list.empty() ? "" : ", ") + n;
      throw config_error(key, "unknown operator \"" + name +
                                "\" (known: " + list + ")");
    }
  };
  for (const auto& [name, tol] : o.tolerances)
    check_name("tolerances", name);
  if (!o.fault.empty())
    check_name("fault", o.fault);
  const auto& g = o.shapes;
  H2_ENFORCE(g.d_model > 0 && g.n_head > 0 && g.d_model % g.n_head == 0 &&
               g.seq_len > 0 && g.vocab_size > 0 && g.d_ff > 0 &&
               o.micro_batch > 0,
             "opcheck of an unshaped model");

  auto tol_of = [&](const std::string& op, dtype computed) {
    auto it = o.tolerances.find(op);
    return it != o.tolerances.end() ? it->second : default_tolerance(computed);
  };
  at::AutoGradMode grad(true);
  draws d(o.seed);
  std::vector<opcheck_result> results;
  for (const auto& c : make_cases(o, d)) {
    // The output gradient: N(0, 1/rows), the scale of a mean loss's.
    const auto& shape = c.out_shape;
    std::int64_t rows = 1;
    for (std::size_t i = 0; i + 1 < shape.size(); ++i)
      rows *= shape[i];
    const auto grad_out = d.normal(shape, 1.0 / std::sqrt(rows));
    const auto ref_type = c.fp64_reference ? at::kDouble : at::kFloat;
    auto dut = run_case(device, c, at::kFloat, true, o, grad_out);
    auto ref = run_case(reference, c, ref_type, false, o, grad_out);
    for (std::size_t i = 0; i < dut.tensors.size(); ++i) {
      auto r =
        compare(c.name, dut.names[i], dut.tensors[i], ref.tensors[i],
                tol_of(c.name, dtype_of(dut.computed).value_or(dtype::fp32)));
      r.computed = dtype_name(dut.computed);
      r.reference = dtype_name(ref_type);
      results.push_back(std::move(r));
    }
  }
  // AdamW: fp32 master weights on every chip.
  const std::int64_t f = g.d_ff, m = g.d_model;
  // Weight, gradient, both moments (drawn in this order: a braced list is
  // evaluated left to right).
  const std::vector<at::Tensor> state{
    d.normal({f, m}, 0.02), d.normal({f, m}, 1e-3), d.normal({f, m}, 1e-3),
    d.normal({f, m}, 1e-3).square()};
  auto dut = run_adamw(device, state, true, o);
  auto ref = run_adamw(reference, state, false, o);
  for (std::size_t i = 0; i < dut.tensors.size(); ++i) {
    auto r = compare("adamw", dut.names[i], dut.tensors[i], ref.tensors[i],
                     tol_of("adamw", dtype::fp32));
    r.computed = r.reference = "fp32";
    results.push_back(std::move(r));
  }
  return results;
}

std::vector<std::string>
failed_operators(const std::vector<opcheck_result>& results) {
  std::vector<std::string> out;
  for (const auto& r : results)
    if (!r.passed && std::find(out.begin(), out.end(), r.op) == out.end())
      out.push_back(r.op);
  return out;
}

} // namespace h2::model
