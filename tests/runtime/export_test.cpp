// runtime::checkpoint_model (docs/export.md): a checkpoint's weights come
// back in layer order under H2's names, its logits are what the training
// loss is computed from, the config states the model, and a checkpoint
// that is not its job's model is an error naming the file.
#include "h2/runtime/export.hpp"
#include "h2/runtime/generate.hpp"

#include "h2/core/error.hpp"
#include "h2/core/job.hpp"
#include "h2/devices/device_context.hpp"
#include "h2/model/layers.hpp"
#include "h2/model/stage.hpp"
#include "h2/runtime/stage_state.hpp"

#include "test_jobs.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>

namespace h2::runtime {
namespace {

const std::filesystem::path dir = "/ckpt/step-00000003";

std::string job_text(const std::string& model_toml = test::small_model_toml) {
  return "[job]\nname = \"exported\"\nseed = 5\n" + model_toml +
         test::small_train_toml + "[[nodes]]\nchips = [\"cpu\"]\n";
}

/// A checkpoint in memory at step 3 of `job` (its manifest's job_toml)
/// holding the layers of `weights` drawn from seed 13, not the job's 5 (the
/// model must come from the checkpoint, not from its initialisation), with
/// AdamW moments.
checkpoint checkpoint_of(const std::string& job, const gpt_config& weights) {
  checkpoint c;
  c.manifest.step = 3;
  c.manifest.seed = 5;
  c.manifest.job_toml = job;
  for (int i = 0; i < weights.num_layers(); ++i) {
    auto layer = model::make_layer(weights, i, 13);
    for (auto& p : layer->parameters()) { // AdamW moments, as after a step
      p.exp_avg = p.value.detach() * 0.5;
      p.exp_avg_sq = p.value.detach().square();
    }
    c.layers.push_back(snapshot_layer(*devices::make_host_device(), *layer));
    file_record record;
    record.file = layer_file_name(i);
    record.layer = i;
    c.manifest.files.push_back(record);
  }
  return c;
}

gpt_config small() {
  return parse_job(job_text(), "test").model;
}

TEST(runtime_export, weights_are_the_checkpoints_in_layer_order) {
  const auto c = checkpoint_of(job_text(), small());
  checkpoint_model m(c, dir);
  EXPECT_EQ(m.job_name(), "exported");
  EXPECT_EQ(m.step(), 3);
  EXPECT_EQ(m.config().d_model, 16);
  const auto weights = m.weights();
  std::size_t w = 0;
  for (const auto& layer : c.layers)
    for (const auto& t : layer.tensors) {
      if (t.name.ends_with(".exp_avg") || t.name.ends_with(".exp_avg_sq"))
        continue; // weights only
      ASSERT_LT(w, weights.size()) << t.name;
      EXPECT_EQ(weights[w].name, t.name);
      EXPECT_EQ(weights[w].shape, t.shape);
      ASSERT_EQ(weights[w].values.size() * sizeof(float), t.bytes.size());
      EXPECT_EQ(
        std::memcmp(weights[w].values.data(), t.bytes.data(), t.bytes.size()),
        0)
        << t.name;
      ++w;
    }
  EXPECT_EQ(w, weights.size());
}

TEST(runtime_export, logits_are_what_the_training_loss_is_computed_from) {
  const auto g = small();
  checkpoint_model m(checkpoint_of(job_text(), g), dir);
  const int b = 3;
  std::vector<std::int32_t> tokens(b * g.seq_len);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 5 + 2) % g.vocab_size);
  const auto logits = m.logits(tokens);
  ASSERT_EQ(logits.size(),
            static_cast<std::size_t>(b) * g.seq_len * g.vocab_size);

  // The training path on the same weights: its loss is the mean
  // cross-entropy of these logits.
  model::stage whole(g, 0, g.num_layers(), 13);
  model::micro_batch mb;
  mb.tokens = at::tensor(at::ArrayRef<std::int32_t>(tokens))
                .to(at::kLong)
                .view({b, g.seq_len});
  mb.targets = (mb.tokens + 1).remainder(g.vocab_size);
  mb.loss_scale = 1.0 / (b * g.seq_len);
  const double loss = whole.forward({}, mb).item<double>();
  const auto z = at::from_blob(const_cast<float*>(logits.data()),
                               {b * g.seq_len, g.vocab_size}, at::kFloat);
  const double expected =
    at::cross_entropy_loss(z, mb.targets.reshape({-1})).item<double>();
  EXPECT_NEAR(loss, expected, 1e-6);

  EXPECT_THROW(m.logits(std::vector<std::int32_t>(g.seq_len - 1)),
               internal_error);
  tokens[4] = g.vocab_size;
  EXPECT_THROW(m.logits(tokens), internal_error);
}

TEST(runtime_export, config_states_the_model) {
  const auto g = small();
  checkpoint_model m(checkpoint_of(job_text(), g), dir);
  const auto j = export_config(m, "w.safetensors");
  EXPECT_EQ(j.at("weights"), "w.safetensors");
  EXPECT_EQ(j.at("step"), 3);
  EXPECT_EQ(j.at("job"), "exported");
  EXPECT_EQ(j.at("vocab_size"), g.vocab_size);
  EXPECT_EQ(j.at("seq_len"), g.seq_len);
  EXPECT_EQ(j.at("d_model"), g.d_model);
  EXPECT_EQ(j.at("n_head"), g.n_head);
  EXPECT_EQ(j.at("head_dim"), g.d_model / g.n_head);
  EXPECT_EQ(j.at("n_layer"), g.n_layer);
  EXPECT_EQ(j.at("d_ff"), g.d_ff);
  EXPECT_EQ(j.at("parameters"), model_parameters(g));
  EXPECT_EQ(j.at("tied_embeddings"), false);
  EXPECT_EQ(j.at("layer_norm_eps"), 1e-5);
  EXPECT_EQ(j.at("dtype"), "float32");
}

/// The checkpoint_error `f` throws (fails the test when it throws none).
template <class F>
checkpoint_error error_of(F f) {
  try {
    f();
  } catch (const checkpoint_error& e) {
    return e;
  }
  ADD_FAILURE() << "no checkpoint_error";
  return checkpoint_error(checkpoint_errc::io, "", "none");
}

TEST(runtime_export, a_checkpoint_that_is_not_its_jobs_model_names_the_file) {
  const auto g = small();
  // The job text does not parse.
  auto e = error_of([&] { checkpoint_model m(checkpoint_of("[job", g), dir); });
  EXPECT_EQ(e.kind(), checkpoint_errc::corrupt);
  EXPECT_EQ(e.file(), dir / "manifest.json");

  // Another width: the embedding's file does not hold the job's layer.
  const auto wider = job_text(test::model_toml(17, 8, 32, 2, 4));
  e = error_of([&] { checkpoint_model m(checkpoint_of(wider, g), dir); });
  EXPECT_EQ(e.kind(), checkpoint_errc::mismatch);
  EXPECT_EQ(e.file(), dir / "layer-00000.safetensors");
  EXPECT_NE(std::string(e.what()).find("embedding.wte"), std::string::npos)
    << e.what();

  // Another depth: the manifest lists the wrong number of layers.
  const auto deeper = job_text(test::model_toml(17, 8, 16, 2, 5));
  e = error_of([&] { checkpoint_model m(checkpoint_of(deeper, g), dir); });
  EXPECT_EQ(e.kind(), checkpoint_errc::mismatch);
  EXPECT_EQ(e.file(), dir / "manifest.json");
}

// Generation (runtime/generate.hpp): greedy is the argmax, top-k never
// leaves the k likeliest, a seed gives the same continuation, and a prefix's
// last logits are the full sequence's at that position (causality), for
// both families.
TEST(runtime_generate, sampling_rules) {
  const std::vector<float> logits{0.5f, 3.0f, -1.0f, 2.9f, 3.0f};
  EXPECT_EQ(sample_token(logits, {0.0, 0, 0}, 0.99), 1); // first of equals
  std::set<int> seen;
  for (int i = 0; i < 200; ++i)
    seen.insert(sample_token(logits, {1.0, 2, 0}, i / 200.0));
  EXPECT_EQ(seen, (std::set<int>{1, 4}));
  seen.clear();
  for (int i = 0; i < 200; ++i)
    seen.insert(sample_token(logits, {5.0, 0, 0}, i / 200.0));
  EXPECT_EQ(seen.size(), 5u); // a hot softmax over all reaches every token
}

TEST(runtime_generate, continuations_are_reproducible_and_causal) {
  for (const auto& model :
       {test::small_model_toml, test::small_llama_model_toml}) {
    const auto job = job_text(model);
    const auto g = parse_job(job, "test").model;
    checkpoint_model m(checkpoint_of(job, g), dir);
    const std::vector<std::int32_t> prompt{3, 1, 4};
    const auto a = generate(m, prompt, 12, {0.8, 5, 7});
    EXPECT_EQ(a, generate(m, prompt, 12, {0.8, 5, 7}));
    EXPECT_EQ(a.size(), 12u); // past seq_len (8): a sliding window
    EXPECT_NE(a, generate(m, prompt, 12, {0.8, 5, 8}));
    std::vector<std::int32_t> seq(g.seq_len);
    for (int i = 0; i < g.seq_len; ++i)
      seq[i] = (i * 3 + 1) % g.vocab_size;
    const auto full = m.logits(seq);
    const auto prefix = m.last_logits(std::span(seq).first(5));
    for (int v = 0; v < g.vocab_size; ++v)
      EXPECT_NEAR(prefix[v], full[4 * g.vocab_size + v], 1e-5);
  }
}

} // namespace
} // namespace h2::runtime
