// assign_links: which backend joins each pair of chips of a plan, which end
// dials, and that both ends of a channel agree on its id.
#include "h2/core/error.hpp"
#include "h2/runtime/links.hpp"

#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace h2::runtime {
namespace {

stage_plan on(int node, int index, int first, int end) {
  return {chip_id{node, index}, first, end, false};
}

/// Two replicas over chips of three nodes: pipeline links 0:0-0:1 (one
/// node) and 1:0-2:0 (two nodes), ring links 0:0-1:0 and 0:1-2:0.
plan three_node_plan() {
  plan p;
  p.replicas.push_back({{on(0, 0, 0, 3), on(0, 1, 3, 6)}, 1, 2});
  p.replicas.push_back({{on(1, 0, 0, 3), on(2, 0, 3, 6)}, 1, 2});
  return p;
}

/// Where nodes 0 and 1 (host "host-a") and node 2 ("host-b") listen.
std::map<int, transport::endpoint_address> two_hosts() {
  std::map<int, transport::endpoint_address> out;
  for (int rank : {0, 1, 2})
    out[rank] = {.node_rank = rank,
                 .host_id = rank < 2 ? "host-a" : "host-b",
                 .tcp_host = "127.0.0.1",
                 .tcp_port = static_cast<std::uint16_t>(7000 + rank),
                 .shm_socket = "h2-test-" + std::to_string(rank),
                 .rdma_device = "", // no RDMA device: never rdma
                 .rdma_port = 0};
  return out;
}

const link_assignment* find(const std::vector<link_assignment>& links,
                            chip_id local, chip_id peer) {
  auto i = std::find_if(links.begin(), links.end(), [&](const auto& l) {
    return l.local == local && l.peer == peer;
  });
  return i == links.end() ? nullptr : &*i;
}

TEST(runtime_links, backends_follow_the_table_and_one_end_dials) {
  auto links = assign_links(three_node_plan(), two_hosts(), "auto");

  // Within node 0: one in-process assignment holding both ends.
  const auto* inproc = find(links[0], {0, 0}, {0, 1});
  ASSERT_NE(inproc, nullptr);
  EXPECT_EQ(inproc->backend, "inproc");
  EXPECT_EQ(find(links[0], {0, 1}, {0, 0}), nullptr);

  // Between nodes on one host: shared memory; the lower chip accepts.
  const auto* a = find(links[0], {0, 0}, {1, 0});
  const auto* b = find(links[1], {1, 0}, {0, 0});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->backend, "shm");
  EXPECT_EQ(b->backend, "shm");
  EXPECT_FALSE(a->dial);
  EXPECT_TRUE(b->dial);
  EXPECT_EQ(a->id, b->id);
  EXPECT_EQ(b->peer_address.node_rank, 0); // the dialer's target
  EXPECT_EQ(a->peer_address.node_rank, 1);

  // Between hosts without RDMA devices: tcp.
  const auto* c = find(links[1], {1, 0}, {2, 0});
  const auto* d = find(links[2], {2, 0}, {1, 0});
  ASSERT_NE(c, nullptr);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(c->backend, "tcp");
  EXPECT_TRUE(d->dial);
  EXPECT_EQ(c->id, d->id);

  // Every channel has its own id.
  std::set<std::uint64_t> ids;
  std::size_t ends = 0;
  for (const auto& [rank, ls] : links)
    for (const auto& l : ls) {
      ids.insert(l.id);
      ++ends;
    }
  EXPECT_EQ(ids.size(), plan_links(three_node_plan()).size());
  EXPECT_EQ(ends, 2 * ids.size() - 1); // the in-process one is listed once
}

TEST(runtime_links, a_forced_backend_applies_between_nodes_only) {
  const auto addresses = two_hosts();
  auto links = assign_links(three_node_plan(), addresses, "tcp");
  EXPECT_EQ(find(links[0], {0, 0}, {0, 1})->backend, "inproc");
  EXPECT_EQ(find(links[0], {0, 0}, {1, 0})->backend, "tcp");
  EXPECT_EQ(find(links[1], {1, 0}, {2, 0})->backend, "tcp");
  // shm cannot join two hosts.
  EXPECT_THROW(assign_links(three_node_plan(), addresses, "shm"), config_error);
}

TEST(runtime_links, one_process_joins_every_pair_in_process) {
  // The in-process job: every node rank maps to process 0.
  std::map<int, transport::endpoint_address> here{{0, {}}, {1, {}}, {2, {}}};
  auto links = assign_links(three_node_plan(), here, "");
  ASSERT_EQ(links.size(), 1u);
  EXPECT_EQ(links[0].size(), plan_links(three_node_plan()).size());
  for (const auto& l : links[0])
    EXPECT_EQ(l.backend, "inproc");
}

TEST(runtime_links, a_node_without_a_process_is_named) {
  auto addresses = two_hosts();
  addresses.erase(2);
  try {
    assign_links(three_node_plan(), addresses, "auto");
    FAIL() << "expected a config_error";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("2:0"), std::string::npos) << e.what();
  }
}

TEST(runtime_links, channel_limits_follow_the_plan) {
  auto job = parse_job(
    "[job]\nseed = 1\n" + test::model_toml(1000, 64, 32, 2, 2) +
      "[train]\nsteps = 1\nglobal_batch = 128\nmicro_batch = 2\n"
      "eval_every = 1\neval_batches = 3\n"
      "[transport]\nbucket_mb = 0.25\n"
      "[[nodes]]\nchips = [\"emulated:h100-sxm\", \"emulated:mi250x\"]\n",
    "test");
  // The largest layer is the embedding or the head: 1000 x 32 weights.
  std::int64_t largest = 0;
  for (int l = 0; l < job.model.num_layers(); ++l)
    largest = std::max(largest, layer_parameters(job.model, l));
  ASSERT_GE(largest, 1000 * 32);
  auto p = test::one_replica_plan(job, {2, 2}, 2, 64);
  auto limits = channel_limits_of(job, p);
  // 12 bytes a parameter (value and two moments) beat 2 x 64 x 32 floats of
  // activations and the 256 KiB bucket here.
  ASSERT_GT(largest * 12, 1 << 18);
  EXPECT_EQ(limits.max_payload_bytes,
            3 * static_cast<std::uint64_t>(largest) * 12);
  // Each micro-batch's messages of a training and an eval step, and the
  // two messages of each layer a live re-plan may move (4 layers).
  EXPECT_EQ(limits.max_unawaited, 2u * 64 * 3 + 4 + 4 * 2);

  // Another plan, other limits: micro-batches of 64 sequences carry more
  // activations than any layer's state.
  auto wide = test::one_replica_plan(job, {2, 2}, 64, 2);
  auto wide_limits = channel_limits_of(job, wide);
  EXPECT_EQ(wide_limits.max_payload_bytes, 3 * std::uint64_t{64} * 64 * 32 * 4);
  EXPECT_EQ(wide_limits.max_unawaited, 2u * 2 * 3 + 4 + 4 * 2);
}

/// A chip of each kind, for the device paths.
struct chips_of_each_kind {
  const catalog& profiles = catalog::builtin();
  chip_spec cpu = chip_of_device("cpu", "", profiles);
  chip_spec emulated = chip_of_device("emulated:h100-sxm", "", profiles);
  chip_spec cuda = chip_of_device("cuda:0", "", profiles);
  chip_spec cuda1 = chip_of_device("cuda:1", "", profiles);
  chip_spec hip = chip_of_device("hip:1", "", profiles);
};

TEST(runtime_links, the_device_path_is_named_only_for_gpu_chips) {
  const auto [profiles, cpu, emulated, cuda, cuda1, hip] = chips_of_each_kind{};
  EXPECT_EQ(device_path(cpu, emulated, "shm", true), "");
  EXPECT_EQ(device_path(cuda, emulated, "inproc", true),
            "device tensors handed over, copied onto the receiver's device");
  for (const char* backend : {"shm", "tcp"}) {
    EXPECT_EQ(device_path(cuda, cpu, backend, true),
              "device tensors staged through pinned host memory");
    EXPECT_EQ(device_path(emulated, hip, backend, true),
              device_path(cuda, cpu, backend, true));
  }
  // rdma sends a CUDA chip's registered device memory as it is.
  EXPECT_EQ(device_path(cuda, cpu, "rdma", true),
            "CUDA tensors sent from device memory where it registers as a "
            "dma-buf, else staged through pinned host memory");
  EXPECT_EQ(device_path(emulated, hip, "rdma", true),
            "device tensors staged through pinned host memory");
}

TEST(runtime_links, only_shm_between_cuda_chips_shares_device_memory) {
  const auto [profiles, cpu, emulated, cuda0, cuda1, hip] =
    chips_of_each_kind{};
  EXPECT_TRUE(shares_device_memory(cuda0, cuda1, "shm", true));
  EXPECT_EQ(device_path(cuda0, cuda1, "shm", true),
            "device tensors passed in device memory by CUDA IPC");
  // Turned off by the job, another backend, a chip that is not CUDA.
  EXPECT_FALSE(shares_device_memory(cuda0, cuda1, "shm", false));
  EXPECT_EQ(device_path(cuda0, cuda1, "shm", false),
            "device tensors staged through pinned host memory");
  for (const char* backend : {"inproc", "tcp", "rdma"})
    EXPECT_FALSE(shares_device_memory(cuda0, cuda1, backend, true));
  EXPECT_FALSE(shares_device_memory(cuda0, cpu, "shm", true));
  EXPECT_FALSE(shares_device_memory(hip, cuda0, "shm", true));
}

} // namespace
} // namespace h2::runtime
