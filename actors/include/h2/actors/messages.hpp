// How the runtime's plain structs (runtime/reports.hpp, step_summary.hpp,
// observer.hpp, links.hpp, safetensors.hpp, checkpoint_files.hpp) travel in
// CAF messages: their inspect() overloads, found by argument-dependent
// lookup, so the same messages can cross nodes. The structs themselves know nothing of CAF.
#pragma once

#include "h2/core/chip_id.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/links.hpp"
#include "h2/runtime/observer.hpp"
#include "h2/runtime/reports.hpp"
#include "h2/runtime/safetensors.hpp"
#include "h2/runtime/step_summary.hpp"
#include "h2/transport/endpoint.hpp"
#include "h2/transport/handshake.hpp"

#include <caf/meta/type_name.hpp>

namespace h2 {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_id& x) {
  return f(caf::meta::type_name("chip_id"), x.node, x.index);
}

} // namespace h2

namespace h2::transport {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, control_seal& x) {
  return f(caf::meta::type_name("control_seal"), x.sender, x.seq, x.mac);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, endpoint_address& x) {
  return f(caf::meta::type_name("endpoint_address"), x.node_rank, x.host_id,
           x.tcp_host, x.tcp_port, x.shm_socket, x.rdma_device, x.rdma_port);
}

} // namespace h2::transport

namespace h2::runtime {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, op_record& x) {
  return f(caf::meta::type_name("op_record"), x.kind, x.micro_batch, x.start,
           x.end, x.virtual_seconds, x.chunk);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, clock_pair& x) {
  return f(caf::meta::type_name("clock_pair"), x.virtual_seconds,
           x.wall_seconds);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_report& x) {
  return f(caf::meta::type_name("memory_report"), x.used, x.peak, x.capacity);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_traffic& x) {
  return f(caf::meta::type_name("channel_traffic"), x.peer, x.sent, x.received,
           x.sent_on_device);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, setup_report& x) {
  return f(caf::meta::type_name("setup_report"), x.chip, x.parameters, x.memory,
           x.sent_bytes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_command& x) {
  return f(caf::meta::type_name("step_command"), x.step, x.virtual_barrier);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_charge& x) {
  return f(caf::meta::type_name("layer_charge"), x.forward_seconds,
           x.backward_seconds);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, link_charge& x) {
  return f(caf::meta::type_name("link_charge"), x.from, x.seconds, x.transfers);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_step_report& x) {
  return f(caf::meta::type_name("chip_step_report"), x.chip, x.replica, x.stage,
           x.first_layer, x.layer_ids, x.layer_squared_norms, x.norm_shares,
           x.loss, x.start, x.phase_end, x.forward_seconds, x.backward_seconds,
           x.idle_seconds, x.memory, x.traffic, x.overruns, x.overrun_seconds,
           x.ops, x.layers, x.links);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, update_command& x) {
  return f(caf::meta::type_name("update_command"), x.step, x.lr,
           x.clip_coefficient, x.virtual_barrier);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_update_report& x) {
  return f(caf::meta::type_name("chip_update_report"), x.chip,
           x.optimizer_seconds, x.end, x.memory, x.op);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, eval_command& x) {
  return f(caf::meta::type_name("eval_command"), x.step, x.virtual_barrier);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_eval_report& x) {
  return f(caf::meta::type_name("chip_eval_report"), x.chip, x.loss, x.end);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, parameter_values& x) {
  return f(caf::meta::type_name("parameter_values"), x.name, x.shape, x.values,
           x.layer);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chip_step_stats& x) {
  return f(caf::meta::type_name("chip_step_stats"), x.chip, x.replica, x.stage,
           x.forward_seconds, x.backward_seconds, x.optimizer_seconds,
           x.idle_seconds, x.memory, x.traffic, x.overruns, x.overrun_seconds);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, traced_op& x) {
  return f(caf::meta::type_name("traced_op"), x.chip, x.op);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_summary& x) {
  return f(caf::meta::type_name("step_summary"), x.step, x.loss, x.lr,
           x.grad_norm, x.clip_coefficient, x.step_seconds,
           x.virtual_step_seconds, x.wall_step_seconds, x.pipeline_seconds,
           x.bubble_fraction, x.tokens_per_second, x.virtual_end, x.wall_start,
           x.wall_end, x.chips, x.ops);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, run_summary& x) {
  return f(caf::meta::type_name("run_summary"), x.steps, x.stopped_early,
           x.final_loss, x.final_val_loss, x.mean_step_seconds,
           x.tokens_per_second, x.mean_bubble_fraction, x.virtual_seconds,
           x.wall_seconds);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, link_assignment& x) {
  return f(caf::meta::type_name("link_assignment"), x.id, x.local, x.peer,
           x.peer_address, x.dial, x.backend);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, state_tensor& x) {
  return f(caf::meta::type_name("state_tensor"), x.name, x.dtype, x.shape,
           x.bytes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, layer_state& x) {
  return f(caf::meta::type_name("layer_state"), x.layer, x.tensors);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_record& x) {
  return f(caf::meta::type_name("tensor_record"), x.name, x.dtype, x.shape);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, file_record& x) {
  return f(caf::meta::type_name("file_record"), x.file, x.layer, x.bytes,
           x.crc32c, x.tensors);
}

} // namespace h2::runtime
