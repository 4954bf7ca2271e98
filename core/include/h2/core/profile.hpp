// Chip profiles: what a chip is, from its vendor's spec sheet, plus the
// parameters of its emulation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace h2 {

/// The compute dtype of a chip. The math of an emulated chip really runs in
/// this precision (bf16/fp16 matmuls under autocast, fp32 otherwise).
enum class dtype { fp32, bf16, fp16 };

/// "fp32", "bf16", "fp16".
std::string_view to_string(dtype d) noexcept;

/// Parses a dtype name; nullopt when unknown.
std::optional<dtype> parse_dtype(std::string_view text) noexcept;

/// Bytes per element of a dtype.
int dtype_bytes(dtype d) noexcept;

/// Parameters of an emulated chip's cost function (devices/). They are not
/// from spec sheets: they shape how close to peak a chip runs and what one
/// kernel launch costs. Defaults apply where a profile gives none.
struct emulation_params {
  /// Fraction of peak reached by large matrix products (0, 1].
  double max_efficiency = 0.6;
  /// Rows (tokens) of a matrix product at which it reaches half of
  /// max_efficiency; small micro-batches run further from peak.
  double half_efficiency_rows = 128.0;
  /// Fixed cost of every layer-level operation (launches, syncs), seconds.
  double op_overhead_seconds = 20e-6;
  /// Fixed cost of every transfer to another chip, seconds.
  double link_latency_seconds = 10e-6;
};

/// A chip kind. Units are SI: bytes, bytes per second, FLOP/s.
struct chip_profile {
  std::string name;   ///< catalog key, e.g. "h100-sxm"
  std::string vendor; ///< e.g. "NVIDIA"
  std::string model;  ///< e.g. "H100 SXM5 80GB"
  /// Peak dense throughput per dtype in TFLOP/s; 0 means unsupported.
  double peak_tflops_fp32 = 0;
  double peak_tflops_bf16 = 0;
  double peak_tflops_fp16 = 0;
  std::uint64_t memory_bytes = 0;
  double memory_bandwidth_bytes_per_second = 0;
  /// Chip-to-chip bandwidth (NVLink, Infinity Fabric, HCCS, RoCE), one
  /// direction, bytes per second.
  double interconnect_bytes_per_second = 0;
  /// Where the figures came from (spec sheet URL and notes).
  std::string source;
  emulation_params emulation;

  /// Peak dense FLOP/s (not TFLOP/s) for `d`; 0 when unsupported.
  double peak_flops(dtype d) const noexcept;
};

} // namespace h2
