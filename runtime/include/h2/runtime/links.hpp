// The channels of a plan: which backend joins each pair of chips that
// exchange tensors (a pure decision, assign_links), and opening them for one
// process's chips (wire_channels). The in-process job and the multi-node job
// both wire their chips through these two functions.
#pragma once

#include "h2/core/chip_id.hpp"
#include "h2/core/job.hpp"
#include "h2/core/plan.hpp"
#include "h2/runtime/stage_worker.hpp"
#include "h2/transport/endpoint.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace h2::runtime {

/// One channel a process opens: to `peer` from its chip `local`.
struct link_assignment {
  std::uint64_t id = 0; ///< the channel's id, the same on both ends
  chip_id local;
  chip_id peer;
  /// Where `peer`'s process listens (the dialing end's target).
  transport::endpoint_address peer_address;
  bool dial = false;   ///< dial (else accept; inproc: both ends are here)
  std::string backend; ///< transport::choose_backend's answer
};

/// Every process's channels for `p`, keyed by node rank. `addresses` maps
/// each node rank of the plan's chips (chip_id::node) to the address of the
/// process that runs them; chips whose processes share a node rank are
/// joined in-process (one assignment, on that process, holds both ends).
/// Between processes the backend is transport::choose_backend(`forced`)
/// over available_backends(); the lower chip of a pair accepts, the higher
/// dials it. With `tied_embeddings`, the chips of a replica's embedding and
/// head are joined too (plan_links). Throws config_error when a node has no
/// address or `forced` cannot join two processes.
std::map<int, std::vector<link_assignment>>
assign_links(const plan& p,
             const std::map<int, transport::endpoint_address>& addresses,
             std::string_view forced, bool tied_embeddings = false);

/// Whether a channel of `backend` between chips `a` and `b` passes device
/// tensors in device memory: shm between two CUDA chips, unless the job
/// turned it off (`cuda_ipc`, job key transport.cuda_ipc). Pure.
bool shares_device_memory(const chip_spec& a, const chip_spec& b,
                          std::string_view backend, bool cuda_ipc);

/// How a channel of `backend` between chips `a` and `b` carries a GPU chip's
/// tensors (docs/transport.md, "Device memory"); "" when neither chip is
/// a GPU (`cuda`/`hip`): everything is host memory then. Pure.
std::string device_path(const chip_spec& a, const chip_spec& b,
                        std::string_view backend, bool cuda_ipc);

/// What each channel of plan `p` takes from its peer (docs/transport.md,
/// Bounds):
///   - payloads up to three times the largest message the plan sends: one
///     layer's state (parameters and both AdamW moments in fp32, 12 bytes
///     per parameter), a micro-batch's activations or gradients
///     (micro_batch_size x seq_len x d_model in fp32), or a gradient bucket
///     (transport.bucket_bytes);
///   - at most twice a step's micro-batch count (of an evaluation's, when
///     more) of messages for tags no receive waits for yet, plus 4 for the
///     gradient ring's chunks that run ahead.
/// Pure; the stage workers apply it to their channels whenever the plan
/// changes.
transport::channel_limits channel_limits_of(const job_config& job,
                                            const plan& p);

/// Opens `links` (one process's, from assign_links) and attaches each
/// channel to its chip's set-up in `setups` (with the peer's profile, for
/// link times): in-process pairs first, then dials, then accepts, so that
/// two processes wiring each other never wait on one another. `endpoint`
/// may be null when every link is in-process. `keep` sees every channel
/// opened (so the caller can close them on abort). Throws transport_error
/// (timeout past `until`, handshake failures) or internal_error when a link
/// names a chip without a set-up here.
void wire_channels(
  std::vector<worker_setup>& setups, const std::vector<link_assignment>& links,
  const job_config& job, transport::endpoint* endpoint,
  transport::deadline until,
  const std::function<void(const std::shared_ptr<transport::channel>&)>& keep);

} // namespace h2::runtime
