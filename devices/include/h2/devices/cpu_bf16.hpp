// Which bf16 GEMM a bf16 chip backed by the host CPU computes with
// (docs/emulation.md, "bf16 on the host CPU"). libtorch's own CPU bf16
// kernels are fast and accumulate in fp32 only where the CPU has bf16
// dot-product instructions; elsewhere (AVX2-only hosts) they run about ten
// times slower than fp32 and lose precision. There the chip computes the
// same bf16 GEMM with fp32 kernels instead (bf16_gemm.hpp). Pure logic plus
// one reading of /proc/cpuinfo; no libtorch.
#pragma once

#include "h2/core/job.hpp"

#include <string>
#include <vector>

namespace h2::devices {

/// The path a host's bf16 chips take, and why, in words for a log line.
struct cpu_bf16_choice {
  cpu_bf16 path = cpu_bf16::fp32_accumulate; ///< never automatic
  std::string reason;
};

/// Where this build of libtorch sends CPU bf16 GEMMs.
struct torch_bf16_gemm {
  bool onednn = false; ///< built with oneDNN (x86 CPUs with AVX-512 use it)
  bool onednn_on_arm = false; ///< libtorch 2.x: ARM CPUs with bf16 too
};

/// Resolves `requested` for a CPU with feature flags `cpu_flags` (as
/// /proc/cpuinfo spells them: "avx512_bf16", "amx_bf16" on x86, "bf16" on
/// ARM) and libtorch `torch`. `automatic` is native iff the CPU has bf16
/// dot-product instructions and libtorch's bf16 GEMM uses them; an explicit
/// request is kept.
cpu_bf16_choice choose_cpu_bf16(cpu_bf16 requested,
                                const std::vector<std::string>& cpu_flags,
                                torch_bf16_gemm torch);

/// This host's CPU feature flags: the "flags" (x86) or "Features" (ARM)
/// line of /proc/cpuinfo, empty where it cannot be read. Read once.
const std::vector<std::string>& host_cpu_flags();

/// choose_cpu_bf16() for this host and this build of libtorch.
cpu_bf16_choice host_cpu_bf16(cpu_bf16 requested);

/// "bf16 on this host's CPU: fp32-accumulate (...reason...)": the line
/// h2-launch, h2-node and h2-opcheck print once at start-up.
std::string describe(const cpu_bf16_choice& choice);

} // namespace h2::devices
