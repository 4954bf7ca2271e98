// The job file: what to train, on which chips, how. Parsed from TOML and
// validated here; every error names the key path (docs/job-file.md).
#pragma once

#include "h2/core/catalog.hpp"
#include "h2/core/chip_id.hpp"
#include "h2/core/model_config.hpp"
#include "h2/core/profile.hpp"
#include "h2/core/recompute.hpp"
#include "h2/core/topology.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace h2 {

/// How an emulated chip keeps time (docs/architecture.md, "Emulated chips").
enum class clock_mode {
  virtual_clock, ///< ops advance a per-chip clock without sleeping
  wall,          ///< chips wait out the emulated time for real
};

/// The pipeline schedule (docs/planner.md, "Schedules").
enum class schedule_kind {
  gpipe,
  one_f_one_b,
  interleaved_1f1b,
  zb_h1,
  zb_hetero, ///< ZB-H1 with W placed by each chip's own op times
};

/// Every schedule_kind, in the order `h2-plan --compare` prints them.
inline constexpr schedule_kind all_schedule_kinds[] = {
  schedule_kind::gpipe, schedule_kind::one_f_one_b,
  schedule_kind::interleaved_1f1b, schedule_kind::zb_h1,
  schedule_kind::zb_hetero};

/// "virtual"/"wall"; "gpipe", "1f1b", "interleaved-1f1b", "zb-h1",
/// "zb-hetero".
std::string_view to_string(clock_mode m) noexcept;
std::string_view to_string(schedule_kind k) noexcept;
std::optional<schedule_kind> parse_schedule_kind(std::string_view s) noexcept;
/// Chunks per chip `k` runs when the job does not say (plan.chunks_per_chip):
/// 2 for interleaved-1f1b, 1 for the others.
int default_chunks_per_chip(schedule_kind k) noexcept;
/// The names of every schedule, quoted, for error messages:
/// "\"gpipe\", \"1f1b\", ...".
std::string schedule_kind_choices();

/// Where a chip's device context comes from.
enum class device_backend { cpu, emulated, cuda, hip };
std::string_view to_string(device_backend b) noexcept;

/// How a bf16 chip backed by the host CPU (cpu, emulated) computes its
/// matrix products (docs/emulation.md, "bf16 on the host CPU"). Either way
/// the chip computes what a bf16 GEMM on a GPU computes: bf16 operands,
/// products accumulated in fp32, results rounded to bf16.
enum class cpu_bf16 {
  automatic,      ///< native where the CPU has bf16 dot-product instructions
  native,         ///< libtorch's bf16 kernels under autocast
  fp32_accumulate ///< fp32 kernels on bf16-rounded operands, rounded results
};

/// "auto", "native", "fp32-accumulate".
std::string_view to_string(cpu_bf16 m) noexcept;
std::optional<cpu_bf16> parse_cpu_bf16(std::string_view text) noexcept;

/// One chip of the cluster as the job file declares it.
struct chip_spec {
  chip_id id;
  std::string device; ///< as written: "emulated:h100-sxm", "cpu", "cuda:0"
  device_backend backend = device_backend::cpu;
  int device_index = 0; ///< for cuda/hip
  dtype compute_dtype = dtype::fp32;
  chip_profile profile; ///< catalog profile (emulated) or the host's (cpu)
  /// How bf16 math runs if the chip is backed by the host CPU ([ditorch]
  /// cpu_bf16; ignored on GPUs).
  cpu_bf16 bf16_path = cpu_bf16::automatic;
};

/// The chip a device string names ("cpu", "emulated:<profile>",
/// "cuda:<n>", "hip:<n>"), with its backend, index and profile (emulated
/// profiles from `profiles`) and dtype fp32. Throws config_error at `where`
/// for anything else.
chip_spec chip_of_device(const std::string& device, const std::string& where,
                         const catalog& profiles);

/// Whether `chip` is a GPU (cuda, hip): a real accelerator whose memory and
/// speed are measured on the device.
bool is_gpu(const chip_spec& chip) noexcept;

/// One h2-node process and its chips.
struct node_spec {
  int rank = 0;
  std::vector<chip_spec> chips;
};

enum class source_kind { markov, tokens, shards };

struct data_config {
  source_kind source = source_kind::markov;
  /// Markov source: entropy rate of every transition row, nats per token.
  double entropy_rate = 0;
  /// Token files (nanoGPT raw uint16 or llm.c format, detected by magic).
  std::string train_path;
  std::string val_path; ///< empty: hold out the tail of train_path
  /// Token shards (h2-data tokenize --out DIR): the directory.
  std::string shards_dir;
  /// Held out for validation: of train_path's tokens, or of the shards'
  /// windows.
  double val_fraction = 0.1;
};

struct train_config {
  int steps = 100;
  int global_batch = 8; ///< sequences per optimizer step
  int micro_batch = 1;  ///< sequences per micro-batch
  double lr = 1e-3;     ///< peak learning rate
  double min_lr = 1e-4; ///< floor of the cosine decay
  int warmup_steps = 0;
  int decay_steps = 0; ///< cosine decay length after warm-up (0: to `steps`)
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0; ///< global gradient-norm clip (0: off)
  int eval_every = 0;     ///< validation loss every N steps (0: off)
  int eval_batches = 1;   ///< global batches per validation
  int threads_per_chip = 1;
};

struct emulation_config {
  clock_mode clock = clock_mode::virtual_clock;
  /// Chip memory = profile memory x memory_scale (small models on big chips
  /// would never fill them otherwise).
  double memory_scale = 1.0;
  /// Emulated times are multiplied by this (>= 1 slows every chip down
  /// alike, so the CPU's real math fits inside the emulated time).
  double time_scale = 1.0;
  /// The chips' fixed costs (per-op overhead, link latency) are multiplied
  /// by this (< 1 when a small stand-in model should see the chips' compute
  /// differences instead of their launch overheads).
  double overhead_scale = 1.0;
  /// Overrides of the chips' interconnect figures for every link.
  std::optional<double> link_bandwidth_bytes_per_second;
  std::optional<double> link_latency_seconds;
  /// Relative jitter of every emulated op's time: each op is charged
  /// x (1 + noise x u), u uniform in [-1, 1], drawn from `noise_seed`, the
  /// chip, the step and the op, so a run is reproducible (0: none).
  double noise = 0;
  std::uint64_t noise_seed = 0;
};

/// even: layers spread evenly; manual: as written; automatic ("auto"): the
/// HeteroAuto planner (scheduler/planner.hpp) decides stages, layers,
/// micro-batching, replicas and recomputation.
enum class plan_mode { even, manual, automatic };
std::string_view to_string(plan_mode m) noexcept;

struct plan_config {
  plan_mode mode = plan_mode::even;
  schedule_kind schedule = schedule_kind::one_f_one_b;
  /// schedule = "auto" (mode auto only): the planner plans every schedule
  /// this version runs and keeps the fastest (`schedule` is then unused).
  bool search_schedule = false;
  /// The chip of each stage, in pipeline order (default: every chip, in
  /// chip-id order). With mode automatic: the chips the planner may use.
  std::vector<chip_id> stages;
  /// Layers per stage (manual), summing to model.num_layers().
  std::vector<int> layers;
  /// Activation recomputation per stage (default: none).
  std::vector<recompute_policy> recompute;
  /// Chunks (stages) each chip of `stages` holds, dealt round by round:
  /// stage i of the plan is on chip i mod stages.size() (Megatron's
  /// interleaved layout). `layers` and `recompute` then list every chunk,
  /// in pipeline order. Only interleaved-1f1b and zb-hetero run more than
  /// one. Default: default_chunks_per_chip(schedule); with mode auto and no
  /// key, the planner chooses.
  int chunks_per_chip = 1;
  /// True when the job file sets chunks_per_chip.
  bool chunks_given = false;
  /// ZeRO-1 (docs/planner.md, "Sharded optimizer state"): with replicas,
  /// each layer's AdamW moments are split across the chips that hold it.
  bool zero1 = false;
};

struct metrics_config {
  int port = 0; ///< 0: no HTTP endpoint
  std::string bind = "127.0.0.1";
};

struct transport_config {
  /// Longest wait for a peer's frame before a timeout error, seconds.
  double timeout_seconds = 60;
  /// "auto" (the first of shm, rdma, tcp that can connect two nodes) or a
  /// backend every pair of nodes must use. The H2_TRANSPORT environment
  /// variable overrides it.
  std::string backend = "auto";
  /// CRC32C of every payload (the header always has one).
  bool crc = false;
  /// Shared-memory channels between two CUDA chips pass device tensors by
  /// CUDA IPC (false: through pinned host memory).
  bool cuda_ipc = true;
  /// Bytes of each direction of a shared-memory channel's ring.
  std::uint64_t shm_ring_bytes = std::uint64_t{16} << 20;
  /// Bytes of each direction's shared-memory heap: tensors of 64 KiB and
  /// more are copied once, into a block the receiver adopts (0: none, every
  /// payload streams through the ring).
  std::uint64_t shm_heap_bytes = std::uint64_t{256} << 20;
  /// Bytes of each direction's RDMA receive ring (and of the writer's
  /// staging ring that mirrors it): 64 KiB to 1 GiB.
  std::uint64_t rdma_ring_bytes = std::uint64_t{16} << 20;
  /// Gradients are all-reduced across replicas in buckets of this size.
  std::uint64_t bucket_bytes = std::uint64_t{25} << 20;
  /// What gradients cross the wire as in the all-reduce: fp32 or bf16.
  dtype reduce_dtype = dtype::fp32;
};

/// [runtime]: how chips and the scheduler wait on each other.
struct runtime_config {
  /// Longest a per-step request (set-up, forward/backward, update,
  /// validation, parameter collection) may take before the run fails with a
  /// timeout, seconds. The whole run is bounded by the heartbeats instead.
  double step_timeout_seconds = 600;
};

/// [watchdog]: when a chip's op counts as stalled (docs/cli.md, "Stalled
/// chips"): once it has run longer than `factor` times its predicted time
/// and longer than `floor_seconds`.
struct watchdog_config {
  /// 0 turns the watchdog off. 20: far beyond any throttle or noise a
  /// healthy chip shows, yet minutes before runtime.step_timeout_seconds.
  double factor = 20;
  /// No op is stalled sooner: covers slow first steps (allocator warm-up,
  /// sanitizer builds) and ops without a prediction.
  double floor_seconds = 60;
};

/// [ditorch]: DiTorch's operator check (docs/ditorch.md).
struct ditorch_config {
  /// Before training, check every operator of the GPT on each kind of chip
  /// this process runs (device and dtype; emulated chips compute on the
  /// host CPU) against the host CPU, as h2-opcheck does. A failure ends the
  /// run with exit code 4 before its first step.
  bool check = false;
  /// How bf16 chips backed by the host CPU compute their matrix products
  /// (every chip's chip_spec::bf16_path).
  cpu_bf16 cpu_bf16_path = cpu_bf16::automatic;
};

/// [checkpoint]: where and how often the job saves its training state
/// (docs/checkpoints.md). Without the table, nothing is saved.
struct checkpoint_config {
  std::string dir; ///< root of the step-NNNNNNNN directories; "" = off
  int every = 0;   ///< save every this many steps (0: only at the end)
  int keep = 3;    ///< complete checkpoints kept (older ones are removed)
};

/// [restart]: what h2-launch --nodes does when a node fails (docs/
/// checkpoints.md): end the others, re-plan on the chips that are left and
/// resume from the last complete checkpoint, at most `max` times.
struct restart_config {
  int max = 0; ///< 0: a failed node ends the job
};

/// [cluster]: how the h2-node processes of a job find each other.
struct cluster_config {
  /// How long the coordinator waits for every node to join once it
  /// listens, and how long a node tries to reach the coordinator, seconds.
  /// Past it the job ends with exit code 3 naming the ranks that never
  /// came. 300: cluster schedulers start the processes of one job minutes
  /// apart at worst, yet a missing node is reported, not waited for.
  /// h2-node --join-timeout overrides it.
  double join_timeout_seconds = 300;
};

/// [rebalance] policy: whether the job rebalances by its own decision.
enum class rebalance_mode { off, automatic };

/// "off", "auto".
std::string_view to_string(rebalance_mode m) noexcept;

/// Parses "off" or "auto"; nullopt for anything else.
std::optional<rebalance_mode> parse_rebalance_mode(std::string_view text);

/// [rebalance]: the live-rebalancing policy's settings (docs/rebalance.md).
/// The defaults recover from a 2x throttle within 20 steps (about `window`
/// steps after the smoothed times show it).
struct rebalance_config {
  /// off: never proposes (the admin can still ask: h2-admin rebalance).
  rebalance_mode policy = rebalance_mode::off;
  /// Least predicted gain, as a fraction of the current plan's predicted
  /// step time, after the amortised cost of moving layers.
  double threshold = 0.05;
  /// Consecutive evaluated steps the gain must exceed `threshold`.
  int window = 3;
  /// Steps after a rebalance before the window may start again; also the
  /// steps over which a move's cost is amortised.
  int min_interval = 10;
  /// Weight of the newest step in the exponential smoothing of the
  /// observations (0 < smoothing <= 1; 1: no smoothing). Not a job key.
  double smoothing = 0.5;
};

/// Checks the ranges: threshold >= 0, window >= 1, min_interval >= 0,
/// 0 < smoothing <= 1. Throws config_error at "rebalance.<key>".
void check_rebalance_config(const rebalance_config& config);

/// One [[drills]] entry: before step `step` starts, emulated chip `chip`
/// runs `factor` times slower than its profile (restore: factor 1 again),
/// or (hang) chip `chip`'s next compute op hangs until the watchdog or an
/// abort ends it.
struct drill {
  int step = 0;
  chip_id chip;
  double factor = 1;
  bool hang = false;
};

/// [admin]: the authenticated admin endpoint (docs/admin.md), served by
/// h2-launch and by rank 0 of h2-node.
struct admin_config {
  std::string bind = "127.0.0.1";
  int port = 0;           ///< 0: no admin endpoint
  std::string token_file; ///< the admin token (not the job secret)
  /// TLS for the endpoint (docs/admin.md, "TLS"): PEM files of its
  /// certificate chain and private key (both or neither), and, to admit
  /// only clients holding a certificate it signed, a client CA.
  std::string certificate;
  std::string key;
  std::string client_ca;
  /// The live page (docs/admin.md, "Live page"): "open" (read-only for
  /// anyone who reaches the run's HTTP ports), "token" (only on the admin
  /// endpoint, for a browser that gives the admin token) or "off".
  std::string page = "open";
};

struct security_config {
  /// The job's secret (a token file every node reads); required when the
  /// job runs in several processes.
  std::string secret_file;
  /// TLS between the nodes' actor systems (docs/transport.md, "TLS"): this
  /// node's certificate and private key (PEM) and the CA file its peers'
  /// certificates must be signed by. All three or none ("": no TLS).
  std::string certificate;
  std::string key;
  std::string ca_file;
};

/// A validated job.
struct job_config {
  std::string name = "h2-job";
  std::string origin; ///< file name or "<string>"
  std::uint64_t seed = 0;
  gpt_config model;
  data_config data;
  train_config train;
  emulation_config emulation;
  std::vector<node_spec> nodes;
  plan_config plan;
  metrics_config metrics;
  transport_config transport;
  runtime_config runtime;
  watchdog_config watchdog;
  ditorch_config ditorch;
  checkpoint_config checkpoint;
  restart_config restart;
  cluster_config cluster;
  security_config security;
  rebalance_config rebalance;
  std::vector<drill> drills; ///< in step order
  admin_config admin;
  topology_config topology; ///< [topology]: link tiers (core/topology.hpp)
  catalog profiles;         ///< built-in profiles plus the job's [profiles.*]

  /// Every chip in chip-id order.
  std::vector<const chip_spec*> chips() const;

  /// The chip with `id`, or nullptr.
  const chip_spec* find_chip(const chip_id& id) const;

  /// Tokens per optimizer step.
  std::int64_t tokens_per_step() const {
    return static_cast<std::int64_t>(train.global_batch) * model.seq_len;
  }
};

/// Parses and validates a job from TOML text. `origin` names the input in
/// errors. Throws config_error naming the offending key.
job_config parse_job(std::string_view toml_text, const std::string& origin);

/// Reads and parses a job file; throws config_error (also when unreadable).
job_config load_job_file(const std::string& path);

/// The job `examples/demo.toml`, compiled in (h2-launch's default).
std::string_view demo_job_toml() noexcept;

/// The profile of the CPU this process runs on (backend `cpu`): its model
/// name and physical memory; no peak figures (it is measured, not emulated).
chip_profile host_cpu_profile();

} // namespace h2
