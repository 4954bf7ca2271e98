#include "h2/devices/cpu_bf16.hpp"

#include "h2/devices/torch_compat.hpp"

#include <ATen/Context.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string_view>

namespace h2::devices {

cpu_bf16_choice choose_cpu_bf16(cpu_bf16 requested,
                                const std::vector<std::string>& cpu_flags,
                                torch_bf16_gemm torch) {
  switch (requested) {
    case cpu_bf16::native:
    case cpu_bf16::fp32_accumulate:
      return {requested, "asked for, not chosen from the CPU's flags"};
    case cpu_bf16::automatic:
      break;
  }
  auto has = [&](const char* flag) {
    return std::find(cpu_flags.begin(), cpu_flags.end(), flag) !=
           cpu_flags.end();
  };
  // x86 names its instructions avx512_bf16 and amx_bf16, ARM bf16.
  const char* found = has("amx_bf16")      ? "amx_bf16"
                      : has("avx512_bf16") ? "avx512_bf16"
                      : has("bf16")        ? "bf16"
                                           : nullptr;
  if (!found)
    return {cpu_bf16::fp32_accumulate,
            "the CPU has no bf16 dot-product instructions (avx512_bf16, "
            "amx_bf16 or bf16), where libtorch's bf16 GEMM is slow and "
            "accumulates in bf16"};
  const bool arm = std::string_view(found) == "bf16";
  if (!torch.onednn || (arm && !torch.onednn_on_arm))
    return {cpu_bf16::fp32_accumulate,
            std::string("the CPU has ") + found +
              ", but this libtorch's bf16 GEMM does not use it"};
  return {cpu_bf16::native, std::string("the CPU has ") + found +
                              ", which libtorch's bf16 GEMM (oneDNN) uses"};
}

const std::vector<std::string>& host_cpu_flags() {
  static const std::vector<std::string> flags = [] {
    std::vector<std::string> out;
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (out.empty() && std::getline(in, line)) {
      const auto colon = line.find(':');
      if (colon == std::string::npos)
        continue;
      auto key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
      if (key != "flags" && key != "Features")
        continue;
      std::istringstream words(line.substr(colon + 1));
      for (std::string w; words >> w;)
        out.push_back(w);
    }
    return out;
  }();
  return flags;
}

cpu_bf16_choice host_cpu_bf16(cpu_bf16 requested) {
  torch_bf16_gemm torch;
  torch.onednn = at::hasMKLDNN();
  torch.onednn_on_arm = torch.onednn && H2_TORCH_AT_LEAST(2, 0);
  return choose_cpu_bf16(requested, host_cpu_flags(), torch);
}

std::string describe(const cpu_bf16_choice& choice) {
  return "bf16 on this host's CPU: " + std::string(to_string(choice.path)) +
         " (" + choice.reason + ")";
}

} // namespace h2::devices
