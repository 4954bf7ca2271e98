#include "h2/runtime/checkpointing.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/crc32c.hpp"

#include <cstdio>
#include <fstream>
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
    crc = transport::crc32c(buffer.data(),
                            static_cast<std::size_t>(in.gcount()), crc);
  }
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08x", crc);
  return hex;
}

std::vector<std::pair<std::string, std::string>>
data_hashes(const data_config& data) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto* path : {&data.train_path, &data.val_path})
    if (!path->empty())
      out.emplace_back(*path, "crc32c:" + file_crc32c(*path));
  return out;
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
  m.model = {{"vocab_size", g.vocab_size}, {"seq_len", g.seq_len},
             {"d_model", g.d_model},       {"n_head", g.n_head},
             {"n_layer", g.n_layer},       {"d_ff", g.d_ff},
             {"layers", g.num_layers()},   {"tied_embeddings", false}};
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
  m.data_hashes = data_hashes(job.data);
  m.plan_json = to_json(p, -1);
  m.job_toml = job_text;
  return m;
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
  same("data.source", static_cast<int>(before.data.source),
       static_cast<int>(job.data.source), dir);
  same("data.entropy_rate", before.data.entropy_rate, job.data.entropy_rate,
       dir);
  same("data.train", before.data.train_path, job.data.train_path, dir);
  same("data.val", before.data.val_path, job.data.val_path, dir);
  same("data.val_fraction", before.data.val_fraction, job.data.val_fraction,
       dir);
  for (const auto& [path, hash] : data_hashes(job.data))
    for (const auto& [saved_path, saved_hash] : saved.data_hashes)
      if (saved_path == path)
        same("data (" + path + ")", saved_hash, hash, dir);
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

checkpoint_writer::checkpoint_writer(std::filesystem::path root, int keep)
    : root_(std::move(root)), keep_(keep), thread_([this] { run(); }) {
}

checkpoint_writer::~checkpoint_writer() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !busy_; });
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

double checkpoint_writer::save(checkpoint_manifest manifest,
                               std::vector<layer_state> layers) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !busy_; });
  const double waited =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
  if (error_)
    std::rethrow_exception(std::exchange(error_, nullptr));
  next_manifest_ = std::move(manifest);
  next_layers_ = std::move(layers);
  busy_ = true;
  lock.unlock();
  changed_.notify_all();
  return waited;
}

void checkpoint_writer::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !busy_; });
  if (error_)
    std::rethrow_exception(std::exchange(error_, nullptr));
}

void checkpoint_writer::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return busy_ || stopping_; });
    if (!busy_)
      return;
    auto manifest = std::move(next_manifest_);
    auto layers = std::move(next_layers_);
    lock.unlock();
    std::exception_ptr failed;
    try {
      write_checkpoint(root_, std::move(manifest), layers);
      prune_checkpoints(root_, keep_);
    } catch (...) {
      failed = std::current_exception();
    }
    layers.clear(); // the host copies go before the next save may start
    lock.lock();
    if (failed)
      error_ = failed;
    busy_ = false;
    changed_.notify_all();
  }
}

} // namespace h2::runtime
