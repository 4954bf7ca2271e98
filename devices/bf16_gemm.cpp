#include "h2/devices/bf16_gemm.hpp"

#include "h2/core/error.hpp"

#include <ATen/TensorOperators.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <utility>
#include <vector>

namespace h2::devices::bf16_gemm {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local bool active_on_thread = false;

/// The value a bf16 operand holds, as fp32 (exact: bf16 is a prefix of
/// fp32).
at::Tensor widened(const at::Tensor& t) {
  return t.to(at::kBFloat16).to(at::kFloat);
}

/// An fp32 result rounded to bf16 (round to nearest even), then given
/// `type`, the dtype of the input it is the gradient of.
at::Tensor rounded(const at::Tensor& fp32, at::ScalarType type) {
  return fp32.to(at::kBFloat16).to(type);
}

/// The operands come in as autocast would hand them over (fp32 master
/// weights, bf16 activations); the kernels below are plain fp32 ones, so
/// autocast must not turn them back into bf16 kernels.
c10::impl::ExcludeDispatchKeyGuard no_autocast() {
  return c10::impl::ExcludeDispatchKeyGuard(c10::DispatchKey::AutocastCPU);
}

/// Remembers what backward needs of an input besides its bf16 value.
void remember(AutogradContext* ctx, const std::string& name,
              const at::Tensor& input) {
  ctx->saved_data[name + "_dtype"] =
    static_cast<std::int64_t>(input.scalar_type());
  ctx->saved_data[name + "_sizes"] = input.sizes().vec();
}

at::ScalarType dtype_of(AutogradContext* ctx, const std::string& name) {
  return static_cast<at::ScalarType>(ctx->saved_data[name + "_dtype"].toInt());
}

std::vector<std::int64_t> sizes_of(AutogradContext* ctx,
                                   const std::string& name) {
  return ctx->saved_data[name + "_sizes"].toIntVector();
}

/// Saves the bf16 values of a GEMM's operands `a` and `b` for backward,
/// with the dtype and sizes their gradients must have; returns them
/// widened to fp32.
std::pair<at::Tensor, at::Tensor>
save_operands(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
  const auto ab = a.to(at::kBFloat16);
  const auto bb = b.to(at::kBFloat16);
  ctx->save_for_backward({ab, bb});
  remember(ctx, "a", a);
  remember(ctx, "b", b);
  return {widened(ab), widened(bb)};
}

/// What save_operands() saved, widened to fp32.
std::pair<at::Tensor, at::Tensor> saved_operands(AutogradContext* ctx) {
  const auto saved = ctx->get_saved_variables();
  return {widened(saved[0]), widened(saved[1])};
}

/// x W^T of the bf16 values of x and W, accumulated and returned in fp32
/// (the caller adds the bias and rounds, as a GEMM's epilogue does).
struct linear_fn : torch::autograd::Function<linear_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight) {
    auto guard = no_autocast();
    const auto [xw, ww] = save_operands(ctx, x, weight);
    return at::linear(xw, ww);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto guard = no_autocast();
    const auto [x, w] = saved_operands(ctx);
    // The output's gradient arrives as the rounded output's: bf16 values.
    const auto& g = grads[0];
    auto dx = rounded(at::matmul(g, w), dtype_of(ctx, "a"));
    auto dw = rounded(at::mm(g.reshape({-1, w.size(0)}).t(),
                             x.reshape({-1, w.size(1)})),
                      dtype_of(ctx, "b"));
    return {dx, dw};
  }
};

/// a @ b of the bf16 values of a and b, rounded to bf16.
struct matmul_fn : torch::autograd::Function<matmul_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b) {
    auto guard = no_autocast();
    const auto [aw, bw] = save_operands(ctx, a, b);
    return at::matmul(aw, bw).to(at::kBFloat16);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto guard = no_autocast();
    const auto [a, b] = saved_operands(ctx);
    const auto g = widened(grads[0]);
    // Broadcast batch dimensions are summed back in fp32, then rounded.
    auto da = at::matmul(g, b.transpose(-2, -1)).sum_to_size(sizes_of(ctx, "a"));
    auto db = at::matmul(a.transpose(-2, -1), g).sum_to_size(sizes_of(ctx, "b"));
    return {rounded(da, dtype_of(ctx, "a")), rounded(db, dtype_of(ctx, "b"))};
  }
};

} // namespace

bool active() noexcept {
  return active_on_thread;
}

bool set_active(bool on) noexcept {
  return std::exchange(active_on_thread, on);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias) {
  H2_ENFORCE(weight.dim() == 2 && x.dim() >= 1 &&
               x.size(-1) == weight.size(1),
             "bf16 linear of x ", x.sizes(), " and weight ", weight.sizes());
  auto y = linear_fn::apply(x, weight);
  // The bias joins the fp32 sums before the one rounding; its gradient
  // (the summed output gradient) is rounded by the cast's backward.
  if (bias.defined())
    y = y + widened(bias);
  return y.to(at::kBFloat16);
}

at::Tensor matmul(const at::Tensor& a, const at::Tensor& b) {
  H2_ENFORCE(a.dim() >= 2 && b.dim() >= 2, "bf16 matmul of ", a.sizes(),
             " and ", b.sizes());
  return matmul_fn::apply(a, b);
}

} // namespace h2::devices::bf16_gemm
