// Hugging Face in and out (docs/export.md, "Hugging Face"): a checkpoint
// exported as a Hugging Face directory and read back (h2-launch
// --init-from) gives bitwise the weights it had, so a run started from it
// trains bitwise as one started from the checkpoint's weights; for both
// families, with GPT-2's transposed Conv1D layouts and llama's grouped
// heads.
#include "h2/actors/local_job.hpp"
#include "h2/core/files.hpp"
#include "h2/runtime/checkpointing.hpp"
#include "h2/runtime/export.hpp"
#include "h2/runtime/hf_format.hpp"
#include "h2/scheduler/plan_builder.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

namespace h2::test {
namespace {

namespace fs = std::filesystem;

class actors_hf : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("h2-hf-test-" + std::to_string(std::random_device{}()));
    fs::create_directories(root_);
  }
  void TearDown() override { h2::remove_tree(root_); }

  std::shared_ptr<job_config> job() const {
    auto j =
      std::make_shared<job_config>(parse_job(small_job_toml(5, GetParam()) + R"(
[[nodes]]
chips = [{device = "emulated:h100-sxm", dtype = "fp32"},
         {device = "emulated:mi250x", dtype = "fp32"}]
[checkpoint]
dir = ")" + (root_ / "ckpt").string() + "\"\n",
                                             "hf.toml"));
    j->train.steps = 2;
    return j;
  }

  /// Losses of 2 steps from `start` (a checkpoint of step 0).
  static std::vector<double>
  run_from(const std::shared_ptr<job_config>& j,
           std::shared_ptr<const runtime::checkpoint> start) {
    j->checkpoint.dir.clear();
    actors::local_job local(j, scheduler::make_plan(*j));
    runtime::step_recorder rec;
    actors::run_options o;
    o.steps = 2;
    o.resume = std::move(start);
    local.run(o, rec);
    return rec.losses();
  }

  fs::path root_;
};

TEST_P(actors_hf, export_then_init_from_trains_as_the_checkpoint) {
  auto j = job();
  {
    actors::local_job local(j, scheduler::make_plan(*j));
    runtime::step_recorder rec;
    actors::run_options o;
    o.steps = 2;
    o.job_text = small_job_toml(5, GetParam()) + "# nodes\n";
    local.run(o, rec);
  }
  const auto saved = runtime::latest_checkpoint(root_ / "ckpt", nullptr);
  ASSERT_TRUE(saved);
  const auto ckpt = runtime::read_checkpoint(*saved);

  // Export: what h2-export --format hf writes.
  const auto hf = root_ / "hf";
  fs::create_directories(hf);
  auto manifest = ckpt.manifest;
  manifest.job_toml = small_job_toml(5, GetParam()) +
                      "[[nodes]]\nchips = [\"emulated:h100-sxm\"]\n";
  runtime::checkpoint with_job{ckpt.dir, manifest, ckpt.layers};
  runtime::checkpoint_model model(with_job, ckpt.dir);
  const auto tensors = runtime::to_hf_tensors(j->model, model.weights());
  std::vector<runtime::state_tensor> file;
  for (const auto& t : tensors)
    file.push_back(runtime::f32_tensor(t.name, t.shape, t.values));
  runtime::write_safetensors(hf / "model.safetensors", file, {});
  std::ofstream(hf / "config.json")
    << runtime::hf_config(j->model, -1, -1).dump(2);

  // The same weights both ways: the checkpoint's without its moments, and
  // the Hugging Face directory's.
  auto from_checkpoint = std::make_shared<runtime::checkpoint>(ckpt);
  for (auto& l : from_checkpoint->layers)
    std::erase_if(l.tensors, [](const runtime::state_tensor& t) {
      return t.name.ends_with(".exp_avg") || t.name.ends_with(".exp_avg_sq");
    });
  from_checkpoint->manifest.step = 0;
  auto from_hf = std::make_shared<runtime::checkpoint>();
  from_hf->layers = runtime::read_hf_model(hf, j->model, "--init-from");
  from_hf->manifest = from_checkpoint->manifest;
  ASSERT_EQ(from_hf->layers.size(), from_checkpoint->layers.size());
  for (std::size_t l = 0; l < from_hf->layers.size(); ++l)
    EXPECT_TRUE(from_hf->layers[l] == from_checkpoint->layers[l])
      << "layer " << l;
  const auto a = run_from(job(), from_checkpoint);
  const auto b = run_from(job(), from_hf);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b); // the first step's loss and the next, bitwise

  // A directory of the other family, or another shape, is refused by name.
  auto other = *j;
  other.model.d_model = 32;
  try {
    runtime::read_hf_model(hf, other.model, "--init-from");
    ADD_FAILURE() << "read a model of another shape";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("the job's model.d_model 32"),
              std::string::npos)
      << e.what();
  }
  other = *j;
  other.model.family =
    GetParam() == small_model_toml ? model_family::llama : model_family::gpt2;
  EXPECT_THROW(runtime::read_hf_model(hf, other.model, "--init-from"),
               config_error);
}

INSTANTIATE_TEST_SUITE_P(families, actors_hf,
                         ::testing::Values(small_model_toml,
                                           small_llama_model_toml,
                                           small_tied_llama_model_toml),
                         [](const auto& info) {
                           return info.param == small_model_toml
                                    ? std::string("gpt2")
                                  : info.param == small_llama_model_toml
                                    ? std::string("llama")
                                    : std::string("tied_llama");
                         });

} // namespace
} // namespace h2::test
