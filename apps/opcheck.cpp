#include "h2/apps/opcheck.hpp"

#include "h2/apps/exit_codes.hpp"
#include "h2/devices/cpu_bf16.hpp"
#include "h2/devices/device_context.hpp"

#include <cstdio>
#include <iostream>
#include <map>
#include <string>

namespace h2::apps {

namespace {

/// "gelu, linear".
std::string comma_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

} // namespace

std::string failure_summary(const std::vector<std::string>& failed) {
  return std::to_string(failed.size()) + " of " +
         std::to_string(model::checked_operators().size()) +
         " operators failed: " + comma_list(failed);
}

model::opcheck_options opcheck_options_of(const job_config& job) {
  model::opcheck_options o;
  o.shapes = job.model;
  o.micro_batch = job.train.micro_batch;
  o.seed = job.seed;
  o.train = job.train;
  return o;
}

void print_opcheck_table(std::ostream& out,
                         const std::vector<model::opcheck_result>& results,
                         bool failures_only) {
  char line[256];
  std::snprintf(line, sizeof(line),
                "%-14s %-12s %-10s %10s %12s %12s %10s %9s %9s  %s\n",
                "operator", "tensor", "dtype/ref", "elements", "max abs err",
                "max rel err", "cosine", "atol", "rtol", "result");
  out << line;
  for (const auto& r : results) {
    if (failures_only && r.passed)
      continue;
    const std::string dtypes = r.computed + "/" + r.reference;
    std::snprintf(line, sizeof(line),
                  "%-14s %-12s %-10s %10lld %12.3e %12.3e %10.7f %9.2e %9.2e  "
                  "%s\n",
                  r.op.c_str(), r.tensor.c_str(), dtypes.c_str(),
                  static_cast<long long>(r.elements), r.max_abs_error,
                  r.max_rel_error, r.cosine, r.tol.atol, r.tol.rtol,
                  r.passed ? "pass" : "FAIL");
    out << line;
  }
}

void print_cpu_bf16(const std::string& program,
                    const std::vector<const chip_spec*>& chips,
                    std::ostream& out) {
  for (const chip_spec* chip : chips)
    if (!is_gpu(*chip) && chip->compute_dtype == dtype::bf16) {
      out << program << ": "
          << devices::describe(devices::host_cpu_bf16(chip->bf16_path))
          << std::endl;
      return;
    }
}

int check_chip_operators(const std::string& program, const job_config& job,
                         const std::vector<const chip_spec*>& chips,
                         const model::opcheck_options& options,
                         std::ostream& out) {
  // One check per kind: the device it computes on, and its dtype.
  std::map<std::string, chip_spec> kinds;
  for (const chip_spec* chip : chips) {
    chip_spec c = *chip;
    if (c.backend == device_backend::emulated) {
      c = chip_of_device("cpu", "", job.profiles);
      c.compute_dtype = chip->compute_dtype;
      c.bf16_path = chip->bf16_path;
    }
    kinds.emplace(
      c.device + " (" + std::string(to_string(c.compute_dtype)) + ")", c);
  }
  const int threads = job.train.threads_per_chip;
  const auto reference = devices::make_host_device(dtype::fp32, threads);
  int code = exit_ok;
  for (const auto& [name, spec] : kinds) {
    auto device = devices::make_device(
      spec, job.emulation,
      devices::chip_clock(clock_mode::virtual_clock,
                          devices::chip_clock::wall_clock::now()),
      threads);
    const auto results = model::check_operators(*device, *reference, options);
    const auto failed = model::failed_operators(results);
    out << "ditorch check: " << name << " against cpu: ";
    if (failed.empty()) {
      out << model::checked_operators().size() << " operators pass"
          << std::endl;
      continue;
    }
    out << failure_summary(failed) << std::endl;
    print_opcheck_table(out, results, true);
    std::cerr << program << ": error: " << name << " failed the operator "
              << "check ([ditorch] check): " << comma_list(failed) << std::endl;
    code = exit_check_failed;
  }
  return code;
}

} // namespace h2::apps
