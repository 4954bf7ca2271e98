#include "h2/model/trainer.hpp"

#include "h2/model/optim.hpp"

namespace h2::model {

single_chip_trainer::single_chip_trainer(const job_config& job,
                                         c10::Device device)
    : job_(job),
      device_(device),
      model_(job.model, 0, job.model.num_layers(), job.seed, device),
      data_(make_data_source(job)) {
}

double single_chip_trainer::train_step(int step,
                                       const std::vector<int>& backward_order) {
  const int size = job_.train.micro_batch;
  const int m = job_.train.global_batch / size;
  const double scale = 1.0 / static_cast<double>(job_.tokens_per_step());
  model_.zero_grad();
  double loss = 0;
  auto batch = [&](int mb) {
    auto b = data_->batch(split::train, step, mb * size, size, scale);
    b.tokens = b.tokens.to(device_);
    b.targets = b.targets.to(device_);
    return b;
  };
  if (backward_order.empty()) {
    for (int mb = 0; mb < m; ++mb) {
      auto l = model_.forward(at::Tensor(), batch(mb));
      loss += l.item<double>();
      l.backward();
    }
  } else {
    std::vector<at::Tensor> losses;
    for (int mb = 0; mb < m; ++mb) {
      losses.push_back(model_.forward(at::Tensor(), batch(mb)));
      loss += losses.back().item<double>();
    }
    for (int mb : backward_order)
      losses.at(static_cast<std::size_t>(mb)).backward();
  }
  if (job_.model.tie_embeddings) {
    // Both copies take the summed gradient (docs/job-file.md).
    auto* e = tied_weight(*model_.layers().front());
    auto* h = tied_weight(*model_.layers().back());
    const auto g = tied_gradient(e->value.grad(), h->value.grad(), e->value);
    e->value.mutable_grad() = g;
    h->value.mutable_grad() = g.clone();
  }
  std::vector<double> norms;
  for (const auto& l : model_.layers())
    norms.push_back(squared_grad_norm(*l));
  double coef = clip_coefficient(global_grad_norm(norms), job_.train.grad_clip);
  double lr = learning_rate(job_.train, step);
  for (const auto& l : model_.layers())
    adamw_update(*l, job_.train, lr, step + 1, coef);
  return loss;
}

} // namespace h2::model
