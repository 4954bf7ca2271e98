#include "h2/core/profile.hpp"

namespace h2 {

std::string_view to_string(dtype d) noexcept {
  switch (d) {
    case dtype::fp32:
      return "fp32";
    case dtype::bf16:
      return "bf16";
    case dtype::fp16:
      return "fp16";
  }
  return "unknown";
}

std::optional<dtype> parse_dtype(std::string_view text) noexcept {
  if (text == "fp32")
    return dtype::fp32;
  if (text == "bf16")
    return dtype::bf16;
  if (text == "fp16")
    return dtype::fp16;
  return std::nullopt;
}

int dtype_bytes(dtype d) noexcept {
  return d == dtype::fp32 ? 4 : 2;
}

double chip_profile::peak_flops(dtype d) const noexcept {
  switch (d) {
    case dtype::fp32:
      return peak_tflops_fp32 * 1e12;
    case dtype::bf16:
      return peak_tflops_bf16 * 1e12;
    case dtype::fp16:
      return peak_tflops_fp16 * 1e12;
  }
  return 0;
}

} // namespace h2
