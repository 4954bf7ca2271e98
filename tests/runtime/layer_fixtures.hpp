// Layers on emulated chips for the runtime's tests: a job of three chips,
// a chip of it, a layer updated once (so it has both AdamW moments).
#pragma once

#include "h2/core/job.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/layers.hpp"
#include "h2/model/optim.hpp"
#include "test_jobs.hpp"

#include <ATen/ops/ones_like.h>

#include <memory>
#include <string>

namespace h2::test {

/// A job of `model` on three chips.
inline std::shared_ptr<job_config> three_chips_of(const std::string& model) {
  return std::make_shared<job_config>(parse_job(small_job_toml(5, model) + R"(
[[nodes]]
chips = ["emulated:h100-sxm", "emulated:mi250x", "emulated:a100-sxm-80gb"]
)",
                                                "family.toml"));
}

/// Chip 0:`index` of `job`.
inline std::unique_ptr<devices::device_context> chip_of(const job_config& job,
                                                        int index) {
  return devices::make_device(
    *job.find_chip(chip_id{0, index}), job.emulation,
    devices::chip_clock(job.emulation.clock,
                        devices::chip_clock::wall_clock::now()),
    1);
}

/// Layer `index` made and updated once on `chip`, so it has both moments.
inline std::unique_ptr<model::layer>
updated_layer(const job_config& job, int index, devices::device_context& chip) {
  devices::thread_binding bind(chip);
  auto l = model::make_layer(job.model, index, 7, chip.torch_device());
  for (auto& p : l->parameters())
    p.value.mutable_grad() = at::ones_like(p.value);
  model::adamw_update(*l, job.train, 1e-3, 1, 1.0);
  for (auto& p : l->parameters())
    p.value.mutable_grad() = at::Tensor();
  return l;
}

} // namespace h2::test
