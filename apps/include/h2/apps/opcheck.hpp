// What h2-opcheck and `[ditorch] check = true` print and decide
// (docs/ditorch.md, "Checking operators").
#pragma once

#include "h2/core/job.hpp"
#include "h2/model/opcheck.hpp"

#include <ostream>
#include <string>
#include <vector>

namespace h2::apps {

/// The operator check's settings for `job`: its model's shapes, its
/// micro-batch, its seed and its AdamW hyper-parameters.
model::opcheck_options opcheck_options_of(const job_config& job);

/// "2 of 8 operators failed: gelu, linear" for the operators `failed`.
std::string failure_summary(const std::vector<std::string>& failed);

/// `results` as a table, one row per compared tensor (only the failed ones
/// when `failures_only`).
void print_opcheck_table(std::ostream& out,
                         const std::vector<model::opcheck_result>& results,
                         bool failures_only);

/// Prints "<program>: bf16 on this host's CPU: <path> (<why>)" to `out`
/// once when one of `chips` is a bf16 chip backed by the host CPU (cpu,
/// emulated); nothing otherwise (docs/emulation.md, "bf16 on the host CPU").
void print_cpu_bf16(const std::string& program,
                    const std::vector<const chip_spec*>& chips,
                    std::ostream& out);

/// `[ditorch] check = true`: checks every operator on each kind of chip of
/// `chips` (device and dtype; an emulated chip computes on the host CPU)
/// against the host CPU with `options` (opcheck_options_of(job)), printing a
/// line per kind and the failed rows to `out`, and a line per failed kind to
/// stderr as `program`'s error. Returns exit_ok, or exit_check_failed when an
/// operator failed. Throws device_error when a chip's device is unavailable.
int check_chip_operators(const std::string& program, const job_config& job,
                         const std::vector<const chip_spec*>& chips,
                         const model::opcheck_options& options,
                         std::ostream& out);

} // namespace h2::apps
