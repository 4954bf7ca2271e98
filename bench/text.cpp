// Real text (docs/data.md, docs/benchmarks.md): h2-data's tokenization
// against Debian's spm_encode on the same corpus and model; the data
// loader's share of a step of examples/text.toml; and that example on the
// wall clock, its tokens/s and loss after its steps. The corpus is
// Debian's fortunes (make deps). h2-data runs as a child process, as
// h2-generate runs it: no tokenizer in a process with libtorch.
#include "bench_common.hpp"
#include "shard_fixture.hpp"

#include "h2/actors/local_job.hpp"
#include "h2/apps/session.hpp"
#include "h2/core/files.hpp"
#include "h2/model/data.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

namespace {

using namespace h2;
namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

/// Seconds `command` (a shell command line) took; throws if it failed.
double timed(const std::string& command) {
  const auto t0 = clock_type::now();
  if (std::system(command.c_str()) != 0)
    throw error("failed: " + command);
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
  const auto out = bench::out_path(argc, argv);
  const fs::path tmp =
    fs::temp_directory_path() /
    ("h2-bench-text-" + std::to_string(std::random_device{}()));
  fs::create_directories(tmp);
  const std::string data = H2_DATA;
  const auto files = test::fortune_files();
  if (files.empty())
    throw error("no /usr/share/games/fortunes: make deps installs fortunes");
  std::string inputs;
  std::uint64_t bytes = 0;
  {
    std::ofstream all(tmp / "corpus.txt", std::ios::binary);
    for (const auto& f : files) {
      inputs += " " + f.string();
      std::ifstream in(f, std::ios::binary);
      all << in.rdbuf();
      bytes += fs::file_size(f);
    }
  }
  std::vector<bench::record> records;
  // 1. Tokenization: the tokenizer of examples/text.toml, then three
  // alternating encodes of the whole corpus by each.
  const auto shards = tmp / "shards";
  const double train_s = timed(data + " tokenize -q --vocab-size 2048 --out " +
                               shards.string() + " --input" + inputs);
  const auto model = (shards / "tokenizer.model").string();
  std::vector<double> ours, theirs;
  for (int i = 0; i < 3; ++i) {
    const auto dir = tmp / ("run" + std::to_string(i));
    ours.push_back(timed(data + " tokenize -q --tokenizer " + model +
                         " --out " + dir.string() + " --input" + inputs));
    theirs.push_back(timed("spm_encode --model " + model +
                           " --output_format id < " +
                           (tmp / "corpus.txt").string() + " > /dev/null"));
  }
  const double mb = static_cast<double>(bytes) / 1e6;
  const double h2_rate = mb / median(ours), spm_rate = mb / median(theirs);
  records.push_back({"tokenize: h2-data vs spm_encode (fortunes)", h2_rate,
                     "MB/s", spm_rate, h2_rate / spm_rate,
                     "median of 3; same model and corpus (" +
                       std::to_string(files.size()) +
                       " files); h2-data writes shards, CRC32C and manifest; "
                       "tokenizer trained in " +
                       std::to_string(train_s).substr(0, 4) + " s"});

  // 2 and 3. examples/text.toml on those shards, on the wall clock.
  auto job = std::make_shared<job_config>(
    load_job_file(std::string(H2_SOURCE_DIR) + "/examples/text.toml"));
  job->data.shards_dir = shards.string();
  job->checkpoint.dir.clear();
  const auto chosen = apps::choose_plan({}, *job);
  actors::local_job local(job, chosen.value);
  runtime::step_recorder rec;
  local.run({job->train.steps, false}, rec);
  std::vector<double> step_s, tps;
  for (std::size_t i = 10; i < rec.steps.size(); ++i) {
    step_s.push_back(rec.steps[i].step_seconds);
    tps.push_back(rec.steps[i].tokens_per_second);
  }
  // The loader: what a step's chips ask of it (the first stage the
  // tokens and the last the targets of every sequence: two draws per
  // sequence), timed alone over 50 steps.
  const auto source = model::make_data_source(*job);
  const int gb = job->train.global_batch;
  const auto t0 = clock_type::now();
  for (int s = 0; s < 50; ++s)
    for (int draw = 0; draw < 2; ++draw)
      source->batch(model::split::train, s, 0, gb, 1.0);
  const double loader_s =
    std::chrono::duration<double>(clock_type::now() - t0).count() / 50;
  const double step = median(step_s);
  records.push_back({"text: data loader share of a step", loader_s / step,
                     "fraction", 0.01, loader_s / step / 0.01,
                     "loader " + std::to_string(loader_s * 1e6).substr(0, 6) +
                       " us per step (2 x global_batch sequences) over the "
                       "median step; baseline: the 1% target"});
  const double mean_tps = [&] {
    double s = 0;
    for (double x : tps)
      s += x;
    return s / static_cast<double>(tps.size());
  }();
  records.push_back(
    {"text: examples/text.toml tokens/s (wall clock)", mean_tps, "tok/s", 0, 0,
     "mean over steps 11.." + std::to_string(rec.steps.size()) +
       ", median step " + std::to_string(step).substr(0, 5) + " s"});
  records.push_back(
    {"text: loss after " + std::to_string(rec.steps.size()) + " steps",
     rec.steps.back().loss, "nats", std::log(2048.0),
     rec.steps.back().loss / std::log(2048.0),
     "baseline: ln(vocab), a uniform guess; val loss " +
       (rec.val_losses.empty() ? std::string("-")
                               : std::to_string(rec.val_losses.back()))});
  for (const auto& r : records)
    bench::print(r);
  bench::append_results(out, records);
  h2::remove_tree(tmp);
}
