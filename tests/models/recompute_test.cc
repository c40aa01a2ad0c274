// model.recompute: blocks (models/recompute.h). Recomputing a block's
// activations in backward must give the gradients, and leave the buffers,
// that keeping them gives: with dropout (the generator is put back), under
// bf16 autocast (its state is put back) and with BatchNorm (its statistics
// are updated once); with the fused training ops as without.

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "cohort/models/gpt.h"
#include "cohort/models/model.h"
#include "models/fused_ops.h"
#include "models/recompute.h"
#include "util/gpt.h"

namespace cohort::models {
namespace {

struct Outcome {
  ckpt::StateDict grads;
  ckpt::StateDict state;
  at::Tensor loss;
};

// One training forward and backward of a model built from `seed`, on
// `input`, with the generator at `seed` + 1 for dropout.
template <class Build>
Outcome step(Build build, const at::Tensor& input, const at::Tensor& labels, bool bf16) {
  torch::manual_seed(3);
  std::shared_ptr<Model> m = build();
  m->train();
  torch::manual_seed(4);
  at::Tensor logits;
  if (bf16) {
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::increment_nesting();
  }
  logits = m->forward(input);
  if (bf16) {
    at::autocast::decrement_nesting();
    at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(false);
  }
  Outcome o;
  o.loss = torch::nn::functional::cross_entropy(logits.to(at::kFloat).flatten(0, logits.dim() - 2),
                                                labels.flatten());
  o.loss.backward();
  for (const auto& item : m->named_parameters()) o.grads.emplace_back(item.key(), item.value().grad().clone());
  o.state = ckpt::stateDict(*m);
  return o;
}

void expectSame(const Outcome& kept, const Outcome& recomputed, const std::string& what) {
  EXPECT_TRUE(torch::equal(kept.loss, recomputed.loss)) << what;
  ASSERT_EQ(kept.grads.size(), recomputed.grads.size());
  for (size_t k = 0; k < kept.grads.size(); ++k) {
    // Bitwise: the same kernels run on the same values in the same order.
    EXPECT_TRUE(torch::equal(kept.grads[k].second, recomputed.grads[k].second))
        << what << ": gradient of " << kept.grads[k].first << " differs by "
        << (kept.grads[k].second - recomputed.grads[k].second).abs().max().item<double>();
  }
  for (size_t k = 0; k < kept.state.size(); ++k) {
    EXPECT_TRUE(torch::equal(kept.state[k].second, recomputed.state[k].second))
        << what << ": " << kept.state[k].first << " differs after the step";
  }
}

// Nodes of `t`'s graph whose name holds `part`.
int nodesNamed(const at::Tensor& t, const std::string& part) {
  std::vector<torch::autograd::Node*> todo{t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int n = 0;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    if (node->name().find(part) != std::string::npos) ++n;
    for (const auto& e : node->next_edges()) todo.push_back(e.function.get());
  }
  return n;
}

TEST(Recompute, TheFunctionRunsAgainInBackwardAndOnlyWithGradients) {
  int calls = 0;
  auto f = [&](const at::Tensor& in) {
    ++calls;
    return (in * in).sum();
  };
  const at::Tensor x = torch::randn({5}, torch::requires_grad());
  at::Tensor y = recomputed(f, x);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(nodesNamed(y, "Recompute"), 1);
  y.backward();
  EXPECT_EQ(calls, 2) << "f ran again in backward";
  EXPECT_TRUE(torch::allclose(x.grad(), 2 * x));
  {
    torch::NoGradGuard noGrad;
    recomputed(f, x);
  }
  EXPECT_EQ(calls, 3) << "without gradients f runs once, as itself";
}

TEST(Recompute, EveryGptBlockAndResNetStageIsRecomputed) {
  GptOptions o = test::gptSizes(64, 8, 3, 2, 16);
  const at::Tensor tokens = torch::randint(0, 64, {2, 8}, torch::kLong);
  EXPECT_EQ(nodesNamed(createGpt(o)->forward(tokens), "Recompute"), 0);
  o.recompute = true;
  auto gpt = createGpt(o);
  EXPECT_EQ(nodesNamed(gpt->forward(tokens), "Recompute"), 3);
  gpt->eval();
  EXPECT_EQ(nodesNamed(gpt->forward(tokens), "Recompute"), 0) << "evaluation keeps nothing anyway";
  ModelConfig c;
  c.arch = ModelArch::resnet18;
  c.smallInput = true;
  c.recompute = Recompute::blocks;
  EXPECT_EQ(nodesNamed(createModel(c, {3, 32, 32})->forward(torch::randn({2, 3, 32, 32})), "Recompute"), 4);
}

TEST(Recompute, GptBlocksGiveBitwiseTheSameGradientsWithDropoutAndInBf16) {
  GptOptions o = test::gptSizes(64, 16, 3, 2, 32);
  o.dropout = 0.2;
  torch::manual_seed(1);
  const at::Tensor tokens = torch::randint(0, 64, {4, 16}, torch::kLong);
  const at::Tensor targets = torch::randint(0, 64, {4, 16}, torch::kLong);
  for (bool fused : {false, true}) {
    // With the fused ops (models/fused_ops.h) too, whose sums do not
    // depend on how the threads split them.
    FusedOpsScope scope(fused);
    for (bool bf16 : {false, true}) {
      GptOptions r = o;
      r.recompute = true;
      const Outcome kept = step([&] { return createGpt(o); }, tokens, targets, bf16);
      const Outcome again = step([&] { return createGpt(r); }, tokens, targets, bf16);
      expectSame(kept, again, std::string(bf16 ? "bf16" : "fp32") + (fused ? ", fused ops" : ""));
    }
  }
  // A negative control: without the generator put back, dropout in the
  // recomputation would differ; other dropout draws give other gradients.
  torch::manual_seed(1);
  const Outcome a = step([&] { return createGpt(o); }, tokens, targets, false);
  GptOptions other = o;
  other.dropout = 0.3;
  const Outcome b = step([&] { return createGpt(other); }, tokens, targets, false);
  EXPECT_FALSE(torch::equal(a.grads[0].second, b.grads[0].second));
}

TEST(Recompute, ResNetStagesGiveTheSameGradientsAndBatchNormStatistics) {
  ModelConfig c;
  c.arch = ModelArch::resnet18;
  c.numClasses = 10;
  c.smallInput = true;
  c.memoryFormat = MemoryLayout::contiguous;
  ModelConfig r = c;
  r.recompute = Recompute::blocks;
  torch::manual_seed(1);
  const at::Tensor images = torch::randn({4, 3, 32, 32});
  const at::Tensor labels = torch::randint(0, 10, {4}, torch::kLong);
  for (bool fused : {false, true}) {
    FusedOpsScope scope(fused);
    const int64_t calls = fusedOpCalls();
    const Outcome kept = step([&] { return createModel(c, {3, 32, 32}); }, images, labels, false);
    const Outcome again = step([&] { return createModel(r, {3, 32, 32}); }, images, labels, false);
    EXPECT_EQ(fusedOpCalls() > calls, fused);
    // running_mean, running_var and num_batches_tracked are in the state.
    expectSame(kept, again, fused ? "resnet18, fused ops" : "resnet18");
  }
}

}  // namespace
}  // namespace cohort::models
