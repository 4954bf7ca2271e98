// A stage's per-layer state (docs/checkpoints.md): copies of its layers'
// parameters and AdamW moments in host memory, keyed by global layer index,
// and the way back into a stage built under any plan.
#include "h2/runtime/stage_state.hpp"

#include "h2/core/error.hpp"
#include "h2/model/optim.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/from_blob.h>

#include <cstring>
#include <vector>

namespace h2::runtime {

namespace {

constexpr const char* exp_avg_suffix = ".exp_avg";
constexpr const char* exp_avg_sq_suffix = ".exp_avg_sq";

} // namespace

state_tensor host_copy(const devices::device_context& device,
                       const std::string& name, const at::Tensor& t) {
  H2_ENFORCE(t.scalar_type() == at::kFloat, name, ": state is fp32, got ",
             c10::toString(t.scalar_type()));
  auto host = device.to_host(t.detach()).contiguous();
  state_tensor out;
  out.name = name;
  out.dtype = "F32";
  out.shape = host.sizes().vec();
  out.bytes.resize(static_cast<std::size_t>(host.numel()) * sizeof(float));
  std::memcpy(out.bytes.data(), host.data_ptr<float>(), out.bytes.size());
  return out;
}

namespace {

/// Copies `s` into `target`, a tensor of `device`: `s` has `shape` (fp32),
/// and `target` takes all of it, or with `share` (a sharded moment, flat)
/// elements [offset, offset + length) of it flattened.
void copy_into(const devices::device_context& device, at::Tensor& target,
               const state_tensor& s, int layer,
               const std::vector<std::int64_t>& shape,
               const model::parameter* share = nullptr) {
  const auto where = "layer " + std::to_string(layer) + ", " + s.name;
  if (s.dtype != "F32" || s.shape != shape)
    throw checkpoint_error(checkpoint_errc::mismatch, "",
                           where + ": expected F32 of the stage's shape, got " +
                             s.dtype);
  auto host = at::from_blob(const_cast<std::uint8_t*>(s.bytes.data()), s.shape,
                            at::TensorOptions(at::kFloat));
  if (share != nullptr)
    host = host.view({-1}).narrow(0, share->shard_offset, share->shard_length);
  at::NoGradGuard no_grad;
  target.copy_(device.to_device(host));
}

} // namespace

layer_state snapshot_layer(const devices::device_context& device,
                           const model::layer& l,
                           std::map<std::string, state_tensor>* gathered) {
  layer_state out;
  out.layer = l.index();
  for (const auto& p : l.parameters()) {
    out.tensors.push_back(host_copy(device, p.name, p.value));
    if (p.shard_length >= 0) {
      H2_ENFORCE(gathered != nullptr, "layer ", l.index(), ", ", p.name,
                 ": sharded moments need the group's gather");
      for (const char* suffix : {exp_avg_suffix, exp_avg_sq_suffix}) {
        auto i = gathered->find(p.name + suffix);
        if (i != gathered->end())
          out.tensors.push_back(std::move(i->second));
      }
      continue;
    }
    // Moments exist once the optimizer has run (docs/checkpoints.md).
    if (p.exp_avg.defined()) {
      out.tensors.push_back(
        host_copy(device, p.name + exp_avg_suffix, p.exp_avg));
      out.tensors.push_back(
        host_copy(device, p.name + exp_avg_sq_suffix, p.exp_avg_sq));
    }
  }
  return out;
}

void restore_layer(const devices::device_context& device, model::layer& l,
                   const layer_state& s) {
  if (s.layer != l.index())
    throw checkpoint_error(checkpoint_errc::mismatch, "",
                           "state of layer " + std::to_string(s.layer) +
                             " offered to layer " + std::to_string(l.index()));
  std::map<std::string, const state_tensor*> by_name;
  for (const auto& t : s.tensors)
    by_name[t.name] = &t;
  auto take = [&](const std::string& name) -> const state_tensor* {
    auto i = by_name.find(name);
    if (i == by_name.end())
      return nullptr;
    const auto* t = i->second;
    by_name.erase(i);
    return t;
  };
  // Per parameter, saved without moments (none before the first update; one
  // that never had a gradient has none after it): cleared after the loop,
  // since make_moments() gives every parameter without moments a slot.
  std::vector<bool> bare;
  for (auto& p : l.parameters()) {
    const auto* value = take(p.name);
    if (value == nullptr)
      throw checkpoint_error(checkpoint_errc::mismatch, "",
                             "layer " + std::to_string(l.index()) +
                               ": no tensor " + p.name);
    const auto shape = p.value.sizes().vec();
    copy_into(device, p.value, *value, l.index(), shape);
    const auto* m1 = take(p.name + exp_avg_suffix);
    const auto* m2 = take(p.name + exp_avg_sq_suffix);
    if ((m1 == nullptr) != (m2 == nullptr))
      throw checkpoint_error(checkpoint_errc::mismatch, "",
                             "layer " + std::to_string(l.index()) + ": " +
                               p.name + " has one AdamW moment of two");
    bare.push_back(m1 == nullptr);
    if (m1 == nullptr)
      continue;
    const bool sharded = p.shard_length >= 0;
    model::make_moments(l); // where there are none yet
    const auto* share = sharded ? &p : nullptr;
    copy_into(device, p.exp_avg, *m1, l.index(), shape, share);
    copy_into(device, p.exp_avg_sq, *m2, l.index(), shape, share);
  }
  if (!by_name.empty())
    throw checkpoint_error(checkpoint_errc::mismatch, "",
                           "layer " + std::to_string(l.index()) +
                             ": unknown tensor " + by_name.begin()->first);
  for (std::size_t i = 0; i < bare.size(); ++i)
    if (bare[i]) {
      auto& p = l.parameters()[i];
      p.exp_avg = at::Tensor(); // the optimizer makes them
      p.exp_avg_sq = at::Tensor();
    }
}

} // namespace h2::runtime
