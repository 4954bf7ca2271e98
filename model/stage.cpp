#include "h2/model/stage.hpp"

#include "h2/core/error.hpp"
#include "h2/model/recompute.hpp"

namespace h2::model {

stage::stage(const gpt_config& cfg, int first_layer, int end_layer,
             std::uint64_t seed, c10::Device device)
    : cfg_(cfg), first_(first_layer), end_(end_layer), device_(device) {
  H2_ENFORCE(0 <= first_layer && first_layer < end_layer &&
               end_layer <= cfg.num_layers(),
             "first=", first_layer, " end=", end_layer,
             " layers=", cfg.num_layers());
  for (int l = first_layer; l < end_layer; ++l)
    layers_.push_back(make_layer(cfg, l, seed, device));
}

stage::stage(const gpt_config& cfg, int first_layer, int end_layer,
             std::vector<std::unique_ptr<layer>> layers, c10::Device device)
    : cfg_(cfg),
      first_(first_layer),
      end_(end_layer),
      device_(device),
      layers_(std::move(layers)) {
  H2_ENFORCE(0 <= first_layer && first_layer < end_layer &&
               end_layer <= cfg.num_layers() &&
               static_cast<int>(layers_.size()) == end_layer - first_layer,
             "first=", first_layer, " end=", end_layer,
             " layers=", cfg.num_layers(), " given=", layers_.size());
  for (std::size_t i = 0; i < layers_.size(); ++i)
    H2_ENFORCE(layers_[i] != nullptr &&
                 layers_[i]->index() == first_layer + static_cast<int>(i),
               "stage [", first_layer, ", ", end_layer, ") given layer ",
               layers_[i] ? layers_[i]->index() : -1, " at ", i);
}

at::Tensor stage::forward(const at::Tensor& input, const micro_batch& mb) {
  at::Tensor x = input;
  int blocks = 0;
  for (auto& l : layers_) {
    // A full recomputation is the caller's: everything here is kept.
    const bool whole_block =
      !recompute_.full && recomputed_part_of(recompute_, l->kind(), blocks) ==
                            recomputed_part::forward;
    blocks += l->kind() == layer_kind::block ? 1 : 0;
    if (!whole_block) {
      x = l->forward(x, mb);
      continue;
    }
    // Blocks read only their input, so the recomputation needs no batch.
    layer* block = l.get();
    x = recomputed(
      [block](const std::vector<at::Tensor>& in) {
        return block->forward(in[0], micro_batch{});
      },
      {x});
  }
  return x;
}

void stage::set_recompute(const recompute_policy& p) {
  H2_ENFORCE(p.blocks >= 0, "recompute blocks=", p.blocks);
  recompute_ = p;
  int blocks = 0;
  for (auto& l : layers_) {
    l->set_attention_recompute(recomputed_part_of(p, l->kind(), blocks) ==
                               recomputed_part::attention);
    blocks += l->kind() == layer_kind::block ? 1 : 0;
  }
}

std::vector<parameter*> stage::parameters() {
  std::vector<parameter*> out;
  for (auto& l : layers_)
    for (auto& p : l->parameters())
      out.push_back(&p);
  return out;
}

void stage::zero_grad() {
  for (auto* p : parameters())
    p->value.mutable_grad() = at::Tensor();
}

std::int64_t stage::parameter_count() const {
  std::int64_t n = 0;
  for (auto& l : layers_)
    n += l->parameter_count();
  return n;
}

} // namespace h2::model
