// Checkpoints (docs/checkpoints.md): how fast their files are saved and
// loaded against plain POSIX I/O of the same bytes on the same disk, and how
// long a save stalls training.
// - save: runtime::write_checkpoint of a GPT-shaped checkpoint (d_model 512,
//   8 blocks, vocabulary 8192: 10 layer files, ~390 MiB of fp32 parameters
//   and AdamW moments) vs write() + fsync() of the same files' bytes and one
//   fsync of their directory; median of alternating rounds, files removed
//   between rounds; target >= 0.8x.
// - load: runtime::read_checkpoint vs read() of the same files into fresh
//   buffers; cold (the files' page cache evicted with posix_fadvise before
//   each read, target >= 0.8x) and warm (for information: the CPU's share).
// - stall: the demo job (examples/demo.toml) saving after every step: each
//   save's training stall (on_checkpoint) over the median step time of the
//   same job without [checkpoint], in the same process, target < 10%; and
//   the step time with / without checkpointing.
// Flags: --out FILE, --dir DIR (default: the temp directory; put it on the
// disk to measure), --reps N (I/O rounds, default 7), --steps N (demo steps
// per run, default 12), --rounds N (demo runs each way, default 2), --every
// N (default 1), --only io|stall.
#include "bench_common.hpp"

#include "h2/actors/local_job.hpp"
#include "h2/core/files.hpp"
#include "h2/core/job.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/scheduler/plan_builder.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

using namespace h2;
namespace fs = std::filesystem;

namespace {

using steady = std::chrono::steady_clock;

double seconds_since(steady::time_point start) {
  return std::chrono::duration<double>(steady::now() - start).count();
}

int int_flag(int argc, char** argv, const std::string& name, int fallback) {
  const auto v = bench::flag_value(argc, argv, name);
  return v.empty() ? fallback : std::stoi(v);
}

[[noreturn]] void fail(const std::string& what, const fs::path& p) {
  throw error(what + " " + p.string() + ": " + std::strerror(errno));
}

// ---- the checkpoint ------------------------------------------------------

/// An F32 tensor of `shape` filled with pseudo-random values (xorshift), so
/// nothing on the way compresses or deduplicates it.
runtime::state_tensor random_f32(std::string name,
                                 std::vector<std::int64_t> shape,
                                 std::uint64_t seed) {
  std::size_t count = 1;
  for (auto d : shape)
    count *= static_cast<std::size_t>(d);
  std::vector<float> values(count);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& v : values) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<std::int32_t>(x)) * 1e-10f;
  }
  return runtime::f32_tensor(std::move(name), std::move(shape), values);
}

/// A parameter and its AdamW moments, as a save after the first step holds.
void add_param(runtime::layer_state& l, const std::string& name,
               std::vector<std::int64_t> shape) {
  const auto seed = static_cast<std::uint64_t>(l.layer * 1000) +
                    static_cast<std::uint64_t>(l.tensors.size());
  l.tensors.push_back(random_f32(name, shape, seed));
  l.tensors.push_back(random_f32(name + ".exp_avg", shape, seed + 1));
  l.tensors.push_back(random_f32(name + ".exp_avg_sq", shape, seed + 2));
}

/// The layers of a GPT as model/layers.cpp names them: embedding, `blocks`
/// blocks, head.
std::vector<runtime::layer_state> gpt_layers(std::int64_t d, std::int64_t vocab,
                                             std::int64_t context, int blocks) {
  std::vector<runtime::layer_state> layers(static_cast<std::size_t>(blocks) +
                                           2);
  for (std::size_t i = 0; i < layers.size(); ++i)
    layers[i].layer = static_cast<int>(i);
  add_param(layers[0], "embedding.wte", {vocab, d});
  add_param(layers[0], "embedding.wpe", {context, d});
  for (int b = 0; b < blocks; ++b) {
    auto& l = layers[static_cast<std::size_t>(b) + 1];
    const std::string p = "block" + std::to_string(b) + ".";
    add_param(l, p + "ln1.weight", {d});
    add_param(l, p + "ln1.bias", {d});
    add_param(l, p + "attn.qkv.weight", {3 * d, d});
    add_param(l, p + "attn.qkv.bias", {3 * d});
    add_param(l, p + "attn.proj.weight", {d, d});
    add_param(l, p + "attn.proj.bias", {d});
    add_param(l, p + "ln2.weight", {d});
    add_param(l, p + "ln2.bias", {d});
    add_param(l, p + "mlp.fc1.weight", {4 * d, d});
    add_param(l, p + "mlp.fc1.bias", {4 * d});
    add_param(l, p + "mlp.fc2.weight", {d, 4 * d});
    add_param(l, p + "mlp.fc2.bias", {d});
  }
  auto& head = layers.back();
  add_param(head, "head.ln_f.weight", {d});
  add_param(head, "head.ln_f.bias", {d});
  add_param(head, "head.lm_head.weight", {vocab, d});
  return layers;
}

// ---- plain POSIX I/O: the baselines ---------------------------------------

/// A file of the checkpoint: its name and bytes.
struct plain_file {
  std::string name;
  std::vector<std::uint8_t> bytes;
};

void write_synced(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  const int fd =
    ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail("cannot create", p);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      fail("cannot write", p);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0)
    fail("cannot fsync", p);
  ::close(fd);
}

void sync_dir(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0)
    fail("cannot fsync directory", p);
  ::close(fd);
}

/// Writes back whatever the file system holds dirty (the removal of the
/// previous round's files), so that it does not land in a timed write.
void sync_file_system(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::syncfs(fd) != 0)
    fail("cannot syncfs", p);
  ::close(fd);
}

/// The whole of `p` in a fresh buffer: a plain load.
std::vector<std::uint8_t> read_whole(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0)
    fail("cannot open", p);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      fail("cannot read", p);
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return bytes;
}

/// The files of `dir`, by name.
std::vector<fs::path> files_of(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file())
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

/// Drops the page cache of every file in `dir` (clean pages: they were
/// fsynced), so the next read comes from the disk. Needs no root.
void evict(const fs::path& dir) {
  for (const auto& p : files_of(dir)) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      fail("cannot open", p);
    ::fdatasync(fd);
    if (::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
      fail("cannot posix_fadvise", p);
    ::close(fd);
  }
}

/// The fraction of the pages of the files in `dir` in the page cache.
double resident_fraction(const fs::path& dir) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t pages = 0, resident = 0;
  for (const auto& p : files_of(dir)) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    const auto size = static_cast<std::size_t>(fs::file_size(p));
    if (fd < 0 || size == 0) {
      if (fd >= 0)
        ::close(fd);
      continue;
    }
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED)
      fail("cannot mmap", p);
    std::vector<unsigned char> in_core((size + page - 1) / page);
    ::mincore(map, size, in_core.data());
    ::munmap(map, size);
    pages += in_core.size();
    for (auto c : in_core)
      resident += c & 1;
  }
  return pages == 0 ? 0 : static_cast<double>(resident) / pages;
}

/// "ext4": what `dir` is on (a tmpfs makes fsync free and reads warm).
std::string file_system_of(const fs::path& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0)
    return "unknown";
  switch (static_cast<unsigned long>(st.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlayfs";
    default: {
      char hex[32];
      std::snprintf(hex, sizeof(hex), "0x%lx",
                    static_cast<unsigned long>(st.f_type));
      return hex;
    }
  }
}

// ---- 1 and 2: save and load bandwidth --------------------------------------

std::vector<bench::record> io_bench(const fs::path& root, int reps) {
  const auto t_build = steady::now();
  const auto layers = gpt_layers(512, 8192, 1024, 8);
  runtime::checkpoint_manifest manifest;
  manifest.step = 100;
  manifest.model = {{"d_model", 512}, {"n_layer", 8}, {"vocab_size", 8192}};
  manifest.optimizer = {{"kind", "adamw"}};
  manifest.seed = 1234;
  manifest.job_toml = "[job]\nname = \"bench\"\n";
  std::printf("built %zu layers in %.2f s\n", layers.size(),
              seconds_since(t_build));

  const fs::path ckpt_root = root / "checkpoint";
  const fs::path plain_dir = root / "plain";
  // The plain baseline writes exactly the checkpoint's files.
  const fs::path ckpt_dir =
    runtime::write_checkpoint(ckpt_root, manifest, layers);
  std::vector<plain_file> files;
  std::uint64_t total_bytes = 0;
  for (const auto& p : files_of(ckpt_dir)) {
    files.push_back({p.filename().string(), read_whole(p)});
    total_bytes += files.back().bytes.size();
  }
  // The manifest last, as the checkpoint writes it.
  std::stable_partition(files.begin(), files.end(), [](const plain_file& f) {
    return f.name != runtime::manifest_file_name;
  });
  const double mb = static_cast<double>(total_bytes) / 1e6;
  std::printf("checkpoint: %zu files, %.1f MiB, on %s (%s)\n\n", files.size(),
              static_cast<double>(total_bytes) / (1 << 20),
              file_system_of(root).c_str(), root.c_str());

  auto time_checkpoint_write = [&] {
    h2::remove_tree(ckpt_root);
    sync_file_system(root);
    const auto t = steady::now();
    runtime::write_checkpoint(ckpt_root, manifest, layers);
    return seconds_since(t);
  };
  auto time_plain_write = [&] {
    h2::remove_tree(plain_dir);
    sync_file_system(root);
    const auto t = steady::now();
    fs::create_directories(plain_dir);
    for (const auto& f : files)
      write_synced(plain_dir / f.name, f.bytes);
    sync_dir(plain_dir);
    return seconds_since(t);
  };
  std::vector<double> save_ckpt, save_plain, save_ratio;
  // A round of each first, untimed: the first writes of a run were slow.
  time_checkpoint_write();
  time_plain_write();
  std::printf("%-6s %14s %14s %7s\n", "save", "checkpoint", "plain", "ratio");
  for (int r = 0; r < reps; ++r) {
    double c = 0, p = 0;
    if (r % 2 == 0) {
      c = time_checkpoint_write();
      p = time_plain_write();
    } else {
      p = time_plain_write();
      c = time_checkpoint_write();
    }
    save_ckpt.push_back(mb / c);
    save_plain.push_back(mb / p);
    save_ratio.push_back(p / c);
    std::printf("%-6d %9.0f MB/s %9.0f MB/s %7.3f\n", r, mb / c, mb / p, p / c);
  }
  h2::remove_tree(plain_dir);

  // Loads read the last checkpoint written; the baseline reads its files.
  std::uint64_t checksum = 0; // keeps the loads from being optimized out
  auto time_checkpoint_read = [&] {
    const auto t = steady::now();
    const auto c = runtime::read_checkpoint(ckpt_dir);
    const double s = seconds_since(t);
    checksum += c.layers.back().tensors.back().bytes.size();
    return s;
  };
  auto time_plain_read = [&] {
    const auto t = steady::now();
    std::vector<std::vector<std::uint8_t>> loaded;
    for (const auto& f : files)
      loaded.push_back(read_whole(ckpt_dir / f.name));
    const double s = seconds_since(t);
    checksum += loaded.back().size();
    return s;
  };
  // Once, untimed: the load gives back what was saved, and eviction works.
  if (!(runtime::read_checkpoint(ckpt_dir).layers == layers))
    throw error("read_checkpoint did not return the layers written");
  evict(ckpt_dir);
  const double resident = resident_fraction(ckpt_dir);
  std::printf("\npage cache after eviction: %.1f%% of the files' pages\n",
              100 * resident);

  std::vector<double> cold_ckpt, cold_plain, warm_ckpt, warm_plain;
  std::vector<double> cold_ratio, warm_ratio;
  std::printf("%-6s %14s %14s %7s %14s %14s %7s\n", "load", "cold ckpt",
              "cold plain", "ratio", "warm ckpt", "warm plain", "ratio");
  for (int r = 0; r < reps; ++r) {
    const bool ckpt_first = r % 2 == 0;
    double c = 0, p = 0;
    for (int k = 0; k < 2; ++k) {
      evict(ckpt_dir);
      if ((k == 0) == ckpt_first)
        c = time_checkpoint_read();
      else
        p = time_plain_read();
    }
    cold_ckpt.push_back(mb / c);
    cold_plain.push_back(mb / p);
    time_plain_read(); // warm the cache
    double wc = 0, wp = 0;
    if (ckpt_first) {
      wc = time_checkpoint_read();
      wp = time_plain_read();
    } else {
      wp = time_plain_read();
      wc = time_checkpoint_read();
    }
    warm_ckpt.push_back(mb / wc);
    warm_plain.push_back(mb / wp);
    cold_ratio.push_back(p / c);
    warm_ratio.push_back(wp / wc);
    std::printf(
      "%-6d %9.0f MB/s %9.0f MB/s %7.3f %9.0f MB/s %9.0f MB/s %7.3f\n", r,
      mb / c, mb / p, p / c, mb / wc, mb / wp, wp / wc);
  }
  std::printf("(checksum %llu)\n\n", static_cast<unsigned long long>(checksum));
  h2::remove_tree(ckpt_root);

  const auto median = [](const std::vector<double>& xs) {
    return bench::quantile(xs, 0.5);
  };
  char what[160];
  std::snprintf(what, sizeof(what), "%zu files, %.0f MiB, %s, median of %d",
                files.size(), static_cast<double>(total_bytes) / (1 << 20),
                file_system_of(root).c_str(), reps);
  const std::string about = what;
  // The ratio of the medians; the median of each round's ratio (the two
  // timed back to back) in the note.
  const auto paired = [&](const std::vector<double>& ratios) {
    char text[64];
    std::snprintf(text, sizeof(text), "; median of paired ratios %.3f",
                  median(ratios));
    return std::string(text);
  };
  std::vector<bench::record> rs;
  rs.push_back({"checkpoint.save_MBps_vs_plain_write_fsync", median(save_ckpt),
                "MB/s", median(save_plain),
                median(save_ckpt) / median(save_plain),
                about +
                  "; write_checkpoint vs write()+fsync() per file and "
                  "a directory fsync" +
                  paired(save_ratio) + "; target >= 0.8"});
  rs.push_back({"checkpoint.load_cold_MBps_vs_plain_read", median(cold_ckpt),
                "MB/s", median(cold_plain),
                median(cold_ckpt) / median(cold_plain),
                about +
                  "; read_checkpoint vs read() into fresh buffers, "
                  "page cache evicted (posix_fadvise) before each" +
                  paired(cold_ratio) + "; target >= 0.8"});
  rs.push_back({"checkpoint.load_warm_MBps_vs_plain_read", median(warm_ckpt),
                "MB/s", median(warm_plain),
                median(warm_ckpt) / median(warm_plain),
                about + "; both from the page cache" + paired(warm_ratio) +
                  " (information)"});
  return rs;
}

// ---- 3: the training stall of a save ---------------------------------------

/// When each step ended and what each save reported.
class stall_observer : public runtime::training_observer {
public:
  void on_step(const runtime::step_summary&) override {
    step_ends.push_back(seconds_since(origin_));
  }

  void on_checkpoint(int steps, double waited_seconds,
                     double stall_seconds) override {
    saves.push_back({steps, waited_seconds, stall_seconds});
  }

  struct save {
    int steps = 0;
    double waited_seconds = 0; ///< for the previous save, part of the stall
    double stall_seconds = 0;  ///< the wait plus the snapshot
  };
  std::vector<double> step_ends; ///< seconds since construction
  std::vector<save> saves;

private:
  steady::time_point origin_ = steady::now();
};

/// Runs the demo for `steps` steps, saving every `every` steps under `root`
/// (no [checkpoint] when empty).
stall_observer run_demo(const fs::path& root, int steps, int every) {
  auto job = std::make_shared<job_config>(
    parse_job(demo_job_toml(), "examples/demo.toml"));
  job->train.steps = steps;
  job->rebalance = rebalance_config{}; // the same plan throughout
  job->drills.clear();
  job->checkpoint.dir = root.string();
  job->checkpoint.every = every;
  actors::local_job local(job, scheduler::make_plan(*job));
  stall_observer o;
  actors::run_options opts(steps, false);
  opts.job_text = std::string(demo_job_toml());
  local.run(opts, o);
  return o;
}

std::vector<bench::record> stall_bench(const fs::path& root, int steps,
                                       int rounds, int every) {
  // Step times: the time between one step's end and the next's, from the
  // third step on (the first two warm up); with checkpointing each holds
  // one save's stall (every = 1).
  std::vector<double> off_steps, on_steps, stalls, waits;
  std::uint64_t ckpt_bytes = 0;
  for (int r = 0; r < 2 * rounds; ++r) {
    const bool on = (r % 2 == 0) == (r / 2 % 2 == 1); // off, on, on, off, ...
    const fs::path dir = root / ("demo-" + std::to_string(r));
    const auto o = run_demo(on ? dir : fs::path(), steps, every);
    std::vector<double> run_steps;
    for (std::size_t i = 2; i < o.step_ends.size(); ++i)
      run_steps.push_back(o.step_ends[i] - o.step_ends[i - 1]);
    auto& into = on ? on_steps : off_steps;
    into.insert(into.end(), run_steps.begin(), run_steps.end());
    std::vector<double> run_stalls;
    for (const auto& s : o.saves)
      if (s.steps >= 2 && s.steps < steps) { // not the save at the end
        stalls.push_back(s.stall_seconds);
        waits.push_back(s.waited_seconds);
        run_stalls.push_back(s.stall_seconds);
      }
    if (on) {
      if (auto latest = runtime::latest_checkpoint(dir, nullptr)) {
        ckpt_bytes = 0;
        for (const auto& p : files_of(*latest))
          ckpt_bytes += fs::file_size(p);
      }
      h2::remove_tree(dir);
    }
    std::printf("demo run %d, checkpoint %-3s: median step %.4f s", r,
                on ? "on" : "off", bench::quantile(run_steps, 0.5));
    if (on)
      std::printf(", median stall %.4f s over %zu saves",
                  bench::quantile(run_stalls, 0.5), run_stalls.size());
    std::printf("\n");
  }
  const double step_off = bench::quantile(off_steps, 0.5);
  const double step_on = bench::quantile(on_steps, 0.5);
  const double stall = bench::quantile(stalls, 0.5);
  const double stall_max = bench::quantile(stalls, 1.0);
  const double wait = bench::quantile(waits, 0.5);
  const double per_run = static_cast<double>(ckpt_bytes) / (1 << 20);
  std::printf("\nsaves %zu (every %d), checkpoint %.1f MiB\n", stalls.size(),
              every, per_run);
  std::printf("%-44s %10.4f s\n", "step without checkpoint, median", step_off);
  std::printf("%-44s %10.4f s\n", "step with checkpoint, median", step_on);
  std::printf("%-44s %10.4f s (max %.4f)\n", "stall per save, median", stall,
              stall_max);
  std::printf("%-44s %10.4f s\n", "  of which waiting for the previous save",
              wait);
  std::printf("%-44s %10.4f\n", "stall / step without checkpoint",
              stall / step_off);
  std::printf("%-44s %10.4f\n\n", "step with / without checkpoint",
              step_on / step_off);

  char what[160];
  std::snprintf(what, sizeof(what),
                "demo job, a save every %d step(s), %.1f MiB each, %zu "
                "saves, %zu steps each way",
                every, per_run, stalls.size(), off_steps.size());
  const std::string about = what;
  char extremes[96];
  std::snprintf(extremes, sizeof(extremes),
                "; max %.4f s; median wait for the previous save %.4f s",
                stall_max, wait);
  std::vector<bench::record> rs;
  rs.push_back({"checkpoint.stall_per_save_vs_step", stall, "s", step_off,
                stall / step_off,
                about +
                  "; on_checkpoint's stall_seconds over the median "
                  "step without [checkpoint]" +
                  extremes + "; target < 0.10"});
  rs.push_back({"checkpoint.step_seconds_with_vs_without", step_on, "s",
                step_off, step_on / step_off,
                about + "; the stall plus the background writer's "
                        "interference"});
  return rs;
}

/// A fresh directory, removed at the end.
struct scratch_dir {
  explicit scratch_dir(fs::path p) : path(std::move(p)) {
    h2::remove_tree(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { h2::remove_tree(path); }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  fs::path path;
};

} // namespace

int main(int argc, char** argv) {
  const std::string only = bench::flag_value(argc, argv, "--only");
  const std::string dir_flag = bench::flag_value(argc, argv, "--dir");
  const fs::path base =
    dir_flag.empty() ? fs::temp_directory_path() : fs::path(dir_flag);
  scratch_dir root(base /
                   ("h2-bench-checkpoint-" + std::to_string(::getpid())));
  if (file_system_of(root.path) == "tmpfs")
    std::printf("warning: %s is a tmpfs: fsync costs nothing and reads are "
                "warm; pass --dir on a disk\n",
                root.path.c_str());

  std::vector<bench::record> rs;
  if (only.empty() || only == "io")
    for (auto& r : io_bench(root.path, int_flag(argc, argv, "--reps", 7)))
      rs.push_back(std::move(r));
  if (only.empty() || only == "stall")
    for (auto& r : stall_bench(root.path, int_flag(argc, argv, "--steps", 12),
                               int_flag(argc, argv, "--rounds", 2),
                               int_flag(argc, argv, "--every", 1)))
      rs.push_back(std::move(r));
  for (const auto& r : rs)
    bench::print(r);
  if (auto out = bench::out_path(argc, argv); !out.empty())
    bench::append_results(out, rs);
  return 0;
}
