#include "h2/runtime/links.hpp"

#include "h2/core/error.hpp"
#include "h2/core/model_config.hpp"
#include "h2/runtime/migration.hpp"
#include "h2/transport/inproc/backend.hpp"

#include <algorithm>

namespace h2::runtime {

transport::channel_limits channel_limits_of(const job_config& job,
                                            const plan& p) {
  const gpt_config& model = job.model;
  std::int64_t largest_layer = 0;
  for (int l = 0; l < model.num_layers(); ++l)
    largest_layer = std::max(largest_layer, layer_parameters(model, l));
  int micro_batch_size = 1, micro_batches = 1;
  for (const auto& r : p.replicas) {
    micro_batch_size = std::max(micro_batch_size, r.micro_batch_size);
    micro_batches = std::max(micro_batches, r.micro_batches);
  }
  const std::uint64_t layer_state =
                        static_cast<std::uint64_t>(largest_layer) * 12,
                      activations =
                        static_cast<std::uint64_t>(micro_batch_size) *
                        static_cast<std::uint64_t>(model.seq_len) *
                        static_cast<std::uint64_t>(model.d_model) * 4;
  transport::channel_limits limits;
  limits.max_payload_bytes =
    3 * std::max({layer_state, activations, job.transport.bucket_bytes});
  // A live re-plan sends each moved layer's state, perhaps before the
  // receiver waits for it (runtime/migration.hpp).
  limits.max_unawaited =
    2 * static_cast<std::size_t>(micro_batches) *
      static_cast<std::size_t>(std::max(1, job.train.eval_batches)) +
    4 + static_cast<std::size_t>(model.num_layers()) * moved_state_messages;
  return limits;
}

bool shares_device_memory(const chip_spec& a, const chip_spec& b,
                          std::string_view backend, bool cuda_ipc) {
  return cuda_ipc && backend == "shm" && a.backend == device_backend::cuda &&
         b.backend == device_backend::cuda;
}

std::string device_path(const chip_spec& a, const chip_spec& b,
                        std::string_view backend, bool cuda_ipc) {
  if (!is_gpu(a) && !is_gpu(b))
    return "";
  if (backend == "inproc")
    return "device tensors handed over, copied onto the receiver's device";
  if (shares_device_memory(a, b, backend, cuda_ipc))
    return "device tensors passed in device memory by CUDA IPC";
  if (backend == "rdma" &&
      (a.backend == device_backend::cuda || b.backend == device_backend::cuda))
    return "CUDA tensors sent from device memory where it registers as a "
           "dma-buf, else staged through pinned host memory";
  return "device tensors staged through pinned host memory";
}

std::map<int, std::vector<link_assignment>>
assign_links(const plan& p,
             const std::map<int, transport::endpoint_address>& addresses,
             std::string_view forced, bool tied_embeddings) {
  auto address_of =
    [&](const chip_id& c) -> const transport::endpoint_address& {
    auto a = addresses.find(c.node);
    if (a == addresses.end())
      throw config_error("", "chip " + c.to_string() + ": node " +
                               std::to_string(c.node) +
                               " has no process in this job");
    return a->second;
  };
  const auto available = transport::available_backends();
  std::map<int, std::vector<link_assignment>> out;
  std::uint64_t id = 0;
  for (const auto& l : plan_links(p, tied_embeddings)) {
    ++id;
    const auto& aa = address_of(l.a);
    const auto& ab = address_of(l.b);
    auto backend = transport::choose_backend(aa, ab, available, forced);
    if (aa.node_rank == ab.node_rank) {
      out[aa.node_rank].push_back({id, l.a, l.b, aa, false, backend});
      continue;
    }
    out[aa.node_rank].push_back({id, l.a, l.b, ab, false, backend});
    out[ab.node_rank].push_back({id, l.b, l.a, aa, true, backend});
  }
  return out;
}

void wire_channels(
  std::vector<worker_setup>& setups, const std::vector<link_assignment>& links,
  const job_config& job, transport::endpoint* endpoint,
  transport::deadline until,
  const std::function<void(const std::shared_ptr<transport::channel>&)>& keep) {
  auto attach = [&](const chip_id& local, const chip_id& peer,
                    std::shared_ptr<transport::channel> ch) {
    worker_setup* setup = nullptr;
    for (auto& w : setups)
      if (w.chip->id == local)
        setup = &w;
    if (setup == nullptr || setup->peers.count(peer) == 0)
      throw internal_error("no chip " + local.to_string() + " with a peer " +
                           peer.to_string() + " here");
    auto& link = setup->peers.at(peer);
    link.channel = ch;
    link.profile = job.find_chip(peer)->profile;
    const chip_spec& chip = *job.find_chip(local);
    if (shares_device_memory(chip, *job.find_chip(peer), ch->backend(),
                             job.transport.cuda_ipc))
      ch->share_device_memory(chip.device_index);
    if (keep)
      keep(link.channel);
  };
  auto need_endpoint = [&](const link_assignment& l) -> transport::endpoint& {
    if (endpoint == nullptr)
      throw internal_error("channel " + l.local.to_string() + " <-> " +
                           l.peer.to_string() + " over " + l.backend +
                           " needs an endpoint");
    return *endpoint;
  };
  for (const auto& l : links)
    if (l.backend == "inproc") {
      auto [x, y] = transport::inproc::make_pair();
      attach(l.local, l.peer, std::move(x));
      attach(l.peer, l.local, std::move(y));
    }
  // Dials before accepts: an accept only picks up a connection that the
  // endpoint's listeners took in the meantime.
  for (const auto& l : links)
    if (l.backend != "inproc" && l.dial)
      attach(l.local, l.peer,
             need_endpoint(l).dial(l.peer_address, l.id, l.backend, until));
  for (const auto& l : links)
    if (l.backend != "inproc" && !l.dial)
      attach(l.local, l.peer, need_endpoint(l).accept(l.id, until));
}

} // namespace h2::runtime
