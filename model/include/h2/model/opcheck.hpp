// Operator consistency across chips (docs/ditorch.md, "Checking
// operators"): every operator the GPT computes with (ops.hpp) runs forward
// and backward on seeded random inputs of a job's shapes on the chip under
// test and on a reference chip, and each output and gradient is compared
// element by element. What h2-opcheck prints and `[ditorch] check = true`
// runs before a job trains.
#pragma once

#include "h2/core/job.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace h2::devices {
class device_context;
}

namespace h2::model {

/// A tensor passes iff |d - r| <= atol + rtol * |r| for every element d of
/// the chip under test and r of the reference.
struct tolerance {
  double atol = 0;
  double rtol = 0;
};

/// fp32: atol = rtol = 1e-5; bf16: atol = rtol = 1.6e-2 (a few bf16 ulps).
tolerance default_tolerance(dtype d) noexcept;

/// The operators checked, in this order: embedding, layer_norm, linear,
/// attention (with its causal mask), gelu, softmax, rms_norm, rope, swiglu,
/// gqa_attention (fewer key/value heads than query heads), cross_entropy,
/// adamw: both families' (gpt2, llama) whatever the job's.
const std::vector<std::string>& checked_operators();

struct opcheck_options {
  gpt_config shapes;      ///< the model whose shapes the inputs take
  int micro_batch = 1;    ///< sequences per input batch
  std::uint64_t seed = 0; ///< of every input and output gradient
  train_config train;     ///< AdamW's hyper-parameters
  /// Per-operator tolerances replacing default_tolerance().
  std::map<std::string, tolerance> tolerances;
  /// Test only: this operator computes wrongly on the chip under test (its
  /// output times 1.05), to show that the check catches it. "" for none.
  std::string fault;
};

/// One compared tensor of one operator.
struct opcheck_result {
  std::string op;        ///< "linear"
  std::string tensor;    ///< "out", "grad x", "grad weight", "value", ...
  std::string computed;  ///< what the chip under test computed in: "bf16"
  std::string reference; ///< what the reference computed in: "fp64"
  std::int64_t elements = 0;
  double max_abs_error = 0;
  /// Largest |d - r| / |r| over elements with |r| >= atol (elements near 0
  /// are judged by atol alone); 0 when there are none.
  double max_rel_error = 0;
  double cosine = 1; ///< of the two tensors flattened (1 when both are 0)
  tolerance tol;
  bool passed = false;
};

/// Runs every operator on `device` (in its compute dtype: autocast to bf16
/// on a bf16 chip) and on `reference` (fp64 for linear, attention, the
/// reductions layer_norm and softmax, and the loss; fp32 otherwise; never
/// autocast) and compares them. The AdamW update runs in fp32 on both, as
/// training keeps fp32 master weights. Each context is bound to the calling
/// thread while it computes. Throws config_error for an unknown operator in
/// `options.tolerances` or `options.fault`.
std::vector<opcheck_result> check_operators(devices::device_context& device,
                                            devices::device_context& reference,
                                            const opcheck_options& options);

/// The operators of `results` that failed, in check order, each once.
std::vector<std::string>
failed_operators(const std::vector<opcheck_result>& results);

} // namespace h2::model
