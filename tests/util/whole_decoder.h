#pragma once

// The whole model a split one is compared with (the tensor-parallel tests):
// built from a seed, its loss on a batch of random tokens, and every
// parameter and gradient.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/models/model.h"
#include "cohort/parallel/tensor_model.h"
#include "parallel/detail/tensor_split.h"

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

  // After a split model's backward on this batch, on its rank of `group`
  // (of `tensors`): each gradient is its slice of the whole model's
  // within `tolerance` (with sequence parallelism once the whole tensors'
  // gradients are summed over the group, as the plan sums them), the
  // whole gradient's norm is the same on every rank, and the slices put
  // back together on rank 0 are the whole model, bitwise, in its order.
  // `at` names the rank and the case in failures.
  void expectSplitGradients(const models::Model& model, const comm::Comm& group, int tensors, bool sequence,
                            double tolerance, const std::string& at) const {
    const int r = group.rank;
    const auto named = model.named_parameters();
    // Each parameter as its own whole part, as the engine's parts are without ZeRO.
    std::vector<at::Tensor> parts;
    std::vector<std::vector<ckpt::PartSlice>> slices;
    for (const auto& p : named) {
      parts.push_back(p.value());
      slices.push_back({ckpt::PartSlice{p.key(), 0, p.value().numel(), 0}});
    }
    if (sequence) parallel::detail::sumWholeGradients(parts, slices, group);
    for (const auto& p : named) {
      const at::Tensor want = parallel::sliceByCut(grads.at(p.key()), parallel::tensorCut(p.key()), tensors, r);
      ASSERT_TRUE(p.value().grad().defined()) << at << ": " << p.key();
      EXPECT_LE((p.value().grad() - want).abs().max().item<double>(), tolerance) << at << ": " << p.key() << " grad";
    }
    at::Tensor squares = torch::tensor({parallel::detail::splitSquares(parts, slices, tensors)}, torch::kFloat64);
    comm::allreduceSum(group, squares, "test gradient norm");
    EXPECT_NEAR(squares.item<double>(), gradSquares, 1e-6 * gradSquares) << at;
    std::vector<std::string> visited;
    parallel::visitWholeTensors(model, group, [&](const std::string& name, const at::Tensor& w) {
      visited.push_back(name);
      EXPECT_TRUE(torch::equal(w, params.at(name))) << name;
    });
    EXPECT_EQ(visited, r == 0 ? order : std::vector<std::string>{}) << at;
  }
};

}  // namespace cohort::test
