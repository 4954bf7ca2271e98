#include "h2/runtime/checkpointing.hpp"

#include "checkpoint_io.hpp"

#include "h2/core/crc32c.hpp"
#include "h2/core/error.hpp"
#include "h2/core/random.hpp"
#include "h2/corpus/shards.hpp"

#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <span>
#include <sstream>

namespace h2::runtime {

namespace {

/// CRC32C of a whole file, hex.
std::string file_crc32c(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw checkpoint_error(checkpoint_errc::io, path,
                           "cannot read the token file to hash it");
  std::vector<char> buffer(std::size_t{1} << 20);
  std::uint32_t crc = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    crc = crc32c(buffer.data(), static_cast<std::size_t>(in.gcount()), crc);
  }
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08x", crc);
  return hex;
}

/// The shard manifest of a job on token shards (nullopt for other sources),
/// read once for data_hashes and data_of.
std::optional<corpus::shard_manifest> shards_of(const data_config& data) {
  if (data.source != source_kind::shards)
    return std::nullopt;
  return corpus::read_shard_manifest(data.shards_dir, "data.shards");
}

std::vector<std::pair<std::string, std::string>>
data_hashes(const data_config& data,
            const std::optional<corpus::shard_manifest>& shards) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto* path : {&data.train_path, &data.val_path})
    if (!path->empty())
      out.emplace_back(*path, "crc32c:" + file_crc32c(*path));
  if (shards) {
    // The tokenizer first (a corpus re-made with another tokenizer is named
    // as such); the shard manifest lists every shard's CRC32C, so its own
    // CRC32C stands for the corpus.
    const auto manifest =
      (std::filesystem::path(data.shards_dir) / corpus::shard_manifest_file)
        .string();
    out.emplace_back(tokenizer_hash_key, shards->tokenizer_hash);
    out.emplace_back(manifest, "crc32c:" + file_crc32c(manifest));
  }
  return out;
}

/// The data position's fixed part (at_step adds the step's).
nlohmann::json data_of(const job_config& job,
                       const std::optional<corpus::shard_manifest>& shards) {
  nlohmann::json d = {
    {"source", job.data.source == source_kind::markov   ? "markov"
               : job.data.source == source_kind::tokens ? "tokens"
                                                        : "shards"},
    {"sequences_per_step", job.train.global_batch}};
  if (shards) {
    const auto windows = corpus::window_count(*shards, job.model.seq_len);
    d["train_windows"] =
      windows - corpus::validation_windows(windows, job.data.val_fraction);
  }
  return d;
}

template <class T>
void same(const std::string& key, const T& saved, const T& now,
          const std::filesystem::path& dir) {
  if (saved == now)
    return;
  std::ostringstream msg;
  msg << "the checkpoint " << dir.string() << " has " << saved << ", the job "
      << now << " (this may not change on resume)";
  throw config_error(key, msg.str());
}

} // namespace

checkpoint_manifest job_manifest(const job_config& job, const plan& p,
                                 const std::string& job_text) {
  checkpoint_manifest m;
  const auto& g = job.model;
  m.model = {
    {"vocab_size", g.vocab_size}, {"seq_len", g.seq_len},
    {"d_model", g.d_model},       {"n_head", g.n_head},
    {"n_layer", g.n_layer},       {"d_ff", g.d_ff},
    {"layers", g.num_layers()},   {"tied_embeddings", g.tie_embeddings}};
  // Keys a gpt2 model of the default epsilon leaves out, so its digest is
  // that of checkpoints written before families existed.
  if (g.family != model_family::gpt2) {
    m.model["family"] = to_string(g.family);
    m.model["n_kv_head"] = g.kv_heads();
    m.model["rope_theta"] = g.rope_theta;
  }
  if (g.norm_eps != gpt_config{}.norm_eps)
    m.model["norm_eps"] = g.norm_eps;
  const auto& t = job.train;
  m.optimizer = {{"kind", "adamw"},
                 {"global_batch", t.global_batch},
                 {"lr", t.lr},
                 {"min_lr", t.min_lr},
                 {"warmup_steps", t.warmup_steps},
                 {"decay_steps", t.decay_steps},
                 {"steps", t.steps},
                 {"weight_decay", t.weight_decay},
                 {"beta1", t.beta1},
                 {"beta2", t.beta2},
                 {"eps", t.eps},
                 {"grad_clip", t.grad_clip}};
  m.seed = job.seed;
  const auto shards = shards_of(job.data);
  m.data_hashes = data_hashes(job.data, shards);
  m.data = data_of(job, shards);
  m.plan_json = to_json(p, -1);
  m.job_toml = job_text;
  m.job_id = random_hex(16); // a resumed run keeps its checkpoint's
  m.model_digest = model_digest(m.model);
  return m;
}

void at_step(checkpoint_manifest& m, std::int64_t step) {
  m.step = step;
  if (!m.data.is_object() || !m.data.contains("sequences_per_step"))
    return;
  const auto sequences =
    step * m.data.at("sequences_per_step").get<std::int64_t>();
  m.data["sequences"] = sequences;
  if (m.data.contains("train_windows")) {
    const auto windows = m.data.at("train_windows").get<std::int64_t>();
    m.data["epoch"] = sequences / windows;
    m.data["position_in_epoch"] = sequences % windows;
  }
}

void check_resumable(const checkpoint_manifest& saved, const job_config& job,
                     const std::filesystem::path& dir) {
  const job_config before =
    parse_job(saved.job_toml, (dir / manifest_file_name).string() + " (job)");
  same("model.vocab_size", before.model.vocab_size, job.model.vocab_size, dir);
  same("model.seq_len", before.model.seq_len, job.model.seq_len, dir);
  same("model.d_model", before.model.d_model, job.model.d_model, dir);
  same("model.n_head", before.model.n_head, job.model.n_head, dir);
  same("model.n_layer", before.model.n_layer, job.model.n_layer, dir);
  same("model.d_ff", before.model.d_ff, job.model.d_ff, dir);
  same("model.family", std::string(to_string(before.model.family)),
       std::string(to_string(job.model.family)), dir);
  same("model.n_kv_head", before.model.kv_heads(), job.model.kv_heads(), dir);
  same("model.rope_theta", before.model.rope_theta, job.model.rope_theta, dir);
  same("model.norm_eps", before.model.norm_eps, job.model.norm_eps, dir);
  same("model.tie_embeddings", before.model.tie_embeddings,
       job.model.tie_embeddings, dir);
  same("data.source", static_cast<int>(before.data.source),
       static_cast<int>(job.data.source), dir);
  same("data.entropy_rate", before.data.entropy_rate, job.data.entropy_rate,
       dir);
  same("data.train", before.data.train_path, job.data.train_path, dir);
  same("data.val", before.data.val_path, job.data.val_path, dir);
  same("data.shards", before.data.shards_dir, job.data.shards_dir, dir);
  same("data.val_fraction", before.data.val_fraction, job.data.val_fraction,
       dir);
  for (const auto& [path, hash] : data_hashes(job.data, shards_of(job.data)))
    for (const auto& [saved_path, saved_hash] : saved.data_hashes)
      if (saved_path == path)
        same(path == tokenizer_hash_key ? "data.shards (tokenizer)"
                                        : "data (" + path + ")",
             saved_hash, hash, dir);
  same("job.seed", saved.seed, job.seed, dir);
  const auto &a = before.train, &b = job.train;
  same("train.global_batch", a.global_batch, b.global_batch, dir);
  same("train.lr", a.lr, b.lr, dir);
  same("train.min_lr", a.min_lr, b.min_lr, dir);
  same("train.warmup_steps", a.warmup_steps, b.warmup_steps, dir);
  same("train.decay_steps", a.decay_steps, b.decay_steps, dir);
  same("train.weight_decay", a.weight_decay, b.weight_decay, dir);
  same("train.beta1", a.beta1, b.beta1, dir);
  same("train.beta2", a.beta2, b.beta2, dir);
  same("train.eps", a.eps, b.eps, dir);
  same("train.grad_clip", a.grad_clip, b.grad_clip, dir);
  if (saved.step >= job.train.steps)
    throw config_error("train.steps",
                       "the checkpoint " + dir.string() + " is at step " +
                         std::to_string(saved.step) + ", the job ends at " +
                         std::to_string(job.train.steps) +
                         ": nothing to resume (raise train.steps or --steps)");
}

std::string write_checkpoint_marker(const std::filesystem::path& root) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec)
    throw checkpoint_error(checkpoint_errc::io, root,
                           "cannot create: " + ec.message());
  const std::string marker = random_hex(16);
  const auto path = root / checkpoint_marker_file;
  auto tmp = path;
  tmp += ".tmp";
  const std::span<const std::uint8_t> piece(
    reinterpret_cast<const std::uint8_t*>(marker.data()), marker.size());
  detail::write_file_synced(tmp, std::span(&piece, 1));
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    throw checkpoint_error(checkpoint_errc::io, path,
                           "cannot rename into place: " + ec.message());
  detail::sync_directory(root);
  return marker;
}

void check_checkpoint_marker(const std::filesystem::path& root,
                             const std::string& expected, int rank) {
  const auto path = root / checkpoint_marker_file;
  std::string seen;
  try {
    seen = detail::read_small_file(path, 4096);
  } catch (const checkpoint_error&) {
    seen.clear(); // missing or unreadable: not the directory rank 0 wrote
  }
  if (seen != expected)
    throw config_error(
      "checkpoint.dir",
      "node " + std::to_string(rank) + " does not see the directory the "
        "coordinator's node writes checkpoints to (" + path.string() +
        (seen.empty() ? " is missing" : " differs") +
        "): put checkpoint.dir on storage every node shares, at the same path");
}

bool files_of_chip(const std::vector<file_record>& files,
                   const std::vector<stage_plan>& chunks,
                   const std::vector<file_record>& so_far) {
  std::set<int> seen;
  for (const auto& f : so_far)
    seen.insert(f.layer);
  auto held = [&](int layer) {
    for (const auto& c : chunks)
      if (c.first_layer <= layer && layer < c.end_layer)
        return true;
    return false;
  };
  for (const auto& f : files)
    if (!held(f.layer) || !seen.insert(f.layer).second)
      return false;
  return true;
}

checkpoint_writer::checkpoint_writer(std::filesystem::path root, int keep)
    : root_(std::move(root)), keep_(keep), thread_([this] { run(); }) {
}

checkpoint_writer::~checkpoint_writer() {
  close();
}

void checkpoint_writer::close() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  std::call_once(joined_, [this] { thread_.join(); });
}

void checkpoint_writer::write_layers(checkpoint_identity id,
                                     std::vector<layer_state> layers,
                                     layers_written done) {
  auto task = [this, id = std::move(id), layers = std::move(layers),
               done = std::move(done)]() mutable {
    std::vector<file_record> records;
    std::exception_ptr failed;
    try {
      const auto dir = partial_checkpoint_dir(root_, id.step, id.job_id);
      for (const auto& l : layers) {
        check_abandoned();
        records.push_back(write_layer_file(dir, l, id));
      }
    } catch (...) {
      failed = std::current_exception();
    }
    layers.clear(); // the host copies go before the callback
    done(std::move(records), failed);
  };
  std::lock_guard<std::mutex> guard(mutex_);
  if (stopping_)
    return;
  queue_.emplace_back(std::move(task));
  changed_.notify_all();
}

void checkpoint_writer::publish(checkpoint_manifest manifest, published done) {
  auto task = [this, manifest = std::move(manifest),
               done = std::move(done)]() {
    std::exception_ptr failed;
    try {
      check_abandoned();
      publish_checkpoint(
        root_, partial_checkpoint_dir(root_, manifest.step, manifest.job_id),
        manifest);
      prune_checkpoints(root_, keep_, manifest.job_id);
    } catch (...) {
      failed = std::current_exception();
    }
    done(failed);
  };
  std::lock_guard<std::mutex> guard(mutex_);
  if (stopping_)
    return;
  queue_.emplace_back(std::move(task));
  changed_.notify_all();
}

void checkpoint_writer::abandon() noexcept {
  abandoned_.store(true);
}

void checkpoint_writer::check_abandoned() const {
  if (abandoned_.load())
    throw cancelled_error("the checkpoint being written under " +
                          root_.string() + " was abandoned");
}

void checkpoint_writer::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty())
      return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr; // its captures (the layers) go outside the lock
    lock.lock();
  }
}

} // namespace h2::runtime
