#pragma once

// The whole model a split one is compared with (the tensor-parallel tests):
// built from a seed, its loss on a batch of random tokens, and every
// parameter and gradient.

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cohort/models/model.h"

namespace cohort::test {

struct WholeDecoder {
  std::map<std::string, at::Tensor> params, grads;
  std::vector<std::string> order;  // the parameters' names, in the model's order
  at::Tensor tokens, targets, logits;
  double loss = 0, gradSquares = 0;

  // make() builds the model once the generator is seeded with `seed`; the
  // batch is 3 windows of `block` tokens below `vocab`, drawn after it.
  WholeDecoder(const std::function<std::shared_ptr<models::Model>()>& make, int64_t vocab, int64_t block,
               uint64_t seed) {
    torch::manual_seed(seed);
    auto model = make();
    tokens = torch::randint(vocab, {3, block}, torch::kLong);
    targets = torch::randint(vocab, {3, block}, torch::kLong);
    logits = model->forward(tokens);
    const at::Tensor l = torch::cross_entropy_loss(logits.reshape({-1, vocab}), targets.reshape({-1}));
    l.backward();
    loss = l.item<double>();
    logits = logits.detach();
    for (const auto& p : model->named_parameters()) {
      order.push_back(p.key());
      params[p.key()] = p.value().detach().clone();
      grads[p.key()] = p.value().grad().clone();
      gradSquares += p.value().grad().to(torch::kDouble).pow(2).sum().item<double>();
    }
  }
};

}  // namespace cohort::test
