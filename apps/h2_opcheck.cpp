// h2-opcheck: every operator the GPT trains with, forward and backward, on a
// chip against a reference chip, with per-operator errors and a verdict
// (docs/ditorch.md, "Checking operators"). Exit codes: 0 every operator
// passed, 4 some operator failed, 2 bad input, 1 a device is missing.
#include "h2/apps/app.hpp"
#include "h2/apps/exit_codes.hpp"
#include "h2/apps/opcheck.hpp"
#include "h2/apps/session.hpp"
#include "h2/core/error.hpp"
#include "h2/devices/cpu_bf16.hpp"
#include "h2/devices/device_context.hpp"

#include "h2/core/text.hpp"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace h2;

struct options {
  std::string device;
  std::string reference = "cpu";
  std::string dtype = "fp32";
  std::string job_path;
  std::string cpu_bf16; ///< "" = the job's [ditorch] cpu_bf16
  std::vector<std::string> tolerances; ///< OP=ATOL[,RTOL]
  std::string fault;                   ///< test only
};

/// A chip of `device` for the check; emulated chips are the host CPU.
chip_spec chip_of(const std::string& device, const std::string& flag,
                  const job_config& job, h2::dtype d) {
  chip_spec c = chip_of_device(device, flag, job.profiles);
  if (c.backend == device_backend::emulated)
    throw config_error(flag, "\"" + device +
                               "\" is an emulated chip, which computes on "
                               "the host CPU: check \"cpu\" instead");
  c.compute_dtype = d;
  return c;
}

/// "OP=ATOL" or "OP=ATOL,RTOL" (RTOL defaults to ATOL).
std::pair<std::string, model::tolerance>
parse_tolerance(const std::string& text) {
  const auto bad = [&] {
    return config_error("--tolerance",
                        "expected OP=ATOL or OP=ATOL,RTOL with non-negative "
                        "numbers, got \"" +
                          text + "\"");
  };
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw bad();
  const auto number = [&](const std::string& s) {
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !(v >= 0) || v == HUGE_VAL)
      throw bad();
    return v;
  };
  const auto values = text.substr(eq + 1);
  const auto comma = values.find(',');
  model::tolerance t;
  t.atol = number(values.substr(0, comma));
  t.rtol =
    comma == std::string::npos ? t.atol : number(values.substr(comma + 1));
  return {text.substr(0, eq), t};
}

int run(const options& o) {
  const auto d = parse_dtype(o.dtype);
  if (!d || *d == dtype::fp16)
    throw config_error("--dtype",
                       "expected fp32 or bf16, got \"" + o.dtype + "\"");
  const auto job = apps::load_job(o.job_path, apps::run_flags{});
  auto options = apps::opcheck_options_of(*job);
  for (const auto& t : o.tolerances)
    options.tolerances.insert(parse_tolerance(t));
  options.fault = o.fault;
  auto device_spec = chip_of(o.device, "--device", *job, *d);
  device_spec.bf16_path = job->ditorch.cpu_bf16_path;
  if (!o.cpu_bf16.empty()) {
    const auto path = parse_cpu_bf16(o.cpu_bf16);
    if (!path)
      throw config_error("--cpu-bf16", "expected auto, native or "
                                       "fp32-accumulate, got \"" +
                                         o.cpu_bf16 + "\"");
    device_spec.bf16_path = *path;
  }
  const auto reference_spec =
    chip_of(o.reference, "--reference", *job, dtype::fp32);
  const int threads = job->train.threads_per_chip;
  const auto clock = devices::chip_clock(
    clock_mode::virtual_clock, devices::chip_clock::wall_clock::now());
  auto device =
    devices::make_device(device_spec, job->emulation, clock, threads);
  auto reference =
    devices::make_device(reference_spec, job->emulation, clock, threads);
  const auto& g = job->model;
  std::cout << "h2-opcheck: " << o.device << " (" << o.dtype << ") against "
            << o.reference << " (fp64 for linear, attention, layer_norm, "
            << "softmax and cross_entropy; fp32 otherwise); shapes of job \""
            << printable(job->name) << "\": batch " << job->train.micro_batch
            << ", seq_len " << g.seq_len << ", d_model " << g.d_model
            << ", heads " << g.n_head << ", d_ff " << g.d_ff << ", vocab "
            << g.vocab_size << ", seed " << job->seed << std::endl;
  if (!is_gpu(device_spec))
    std::cout << "h2-opcheck: "
              << devices::describe(
                   devices::host_cpu_bf16(device_spec.bf16_path))
              << std::endl;
  const auto results = model::check_operators(*device, *reference, options);
  apps::print_opcheck_table(std::cout, results, false);
  const auto failed = model::failed_operators(results);
  if (failed.empty()) {
    std::cout << "h2-opcheck: all " << model::checked_operators().size()
              << " operators pass" << std::endl;
    return apps::exit_ok;
  }
  std::cout << "h2-opcheck: " << apps::failure_summary(failed) << std::endl;
  return apps::exit_check_failed;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App cli{"Run every operator the GPT trains with (embedding, "
               "layer_norm, linear, attention, gelu, softmax, cross_entropy, "
               "adamw) forward and backward on a chip and on a reference chip, "
               "and compare them (docs/ditorch.md). Exit codes: 0 all pass, 4 "
               "some operator failed, 2 bad input, 1 a device is missing."};
  cli.add_option("--device", o.device, "The chip to check: cpu, cuda:N, hip:N")
    ->required();
  cli.add_option("--reference", o.reference,
                 "The reference chip: cpu (default), cuda:N, hip:N");
  cli.add_option("--dtype", o.dtype,
                 "What the checked chip computes in: fp32 (default) or bf16 "
                 "(autocast, as a bf16 chip trains)");
  cli.add_option("--cpu-bf16", o.cpu_bf16,
                 "How a bf16 check on the host CPU computes its GEMMs: auto "
                 "(native where the CPU has bf16 instructions), native, or "
                 "fp32-accumulate (default: the job's [ditorch] cpu_bf16)");
  cli.add_option("--job", o.job_path,
                 "Job file whose model shapes, micro-batch and seed the "
                 "inputs take (default: the built-in demo job)");
  cli.add_option("--tolerance", o.tolerances,
                 "OP=ATOL[,RTOL]: replaces an operator's default tolerance "
                 "(fp32 1e-5, bf16 1.6e-2); repeatable");
  cli
    .add_option("--test-fault", o.fault,
                "Test only: OP computes wrongly (x 1.05) on the checked chip")
    ->group(""); // hidden: not for users
  return apps::parse_and_run(cli, argc, argv, "h2-opcheck",
                             [&] { return run(o); });
}
