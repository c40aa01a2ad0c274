#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include "cohort/train/optimizer.h"
#include "util/optimizer_parameters.h"

namespace cohort::train {
namespace {

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const auto& p : ps) {
    at::Tensor c = at::empty_strided(p.sizes(), p.strides(), p.options());
    c.detach().copy_(p.detach());
    c.set_requires_grad(true);
    out.push_back(c);
  }
  return out;
}

// Runs `steps` steps of both with the same gradients (laid out like each
// parameter) and returns the largest difference between their parameters.
double maxDifference(torch::optim::Optimizer& a, std::vector<at::Tensor>& pa,
                     torch::optim::Optimizer& b, std::vector<at::Tensor>& pb, int steps) {
  for (int s = 0; s < steps; ++s) {
    for (size_t k = 0; k < pa.size(); ++k) {
      at::Tensor g = torch::randn(pa[k].sizes(), pa[k].options().requires_grad(false));
      pa[k].mutable_grad() = g.clone(at::MemoryFormat::Preserve).contiguous(pa[k].suggest_memory_format());
      pb[k].mutable_grad() = g.clone(at::MemoryFormat::Preserve).contiguous(pb[k].suggest_memory_format());
    }
    a.step();
    b.step();
  }
  double worst = 0;
  for (size_t k = 0; k < pa.size(); ++k) {
    worst = std::max(worst, (pa[k] - pb[k]).abs().max().item<double>());
  }
  return worst;
}

struct Case {
  double momentum;
  double dampening;
  bool nesterov;
  double weightDecay;
};

class FusedSgd : public ::testing::TestWithParam<Case> {};

TEST_P(FusedSgd, MatchesLibTorchsSgd) {
  const Case c = GetParam();
  OptimizerConfig oc;
  oc.name = OptimizerKind::sgd;
  oc.lr = 0.05;
  oc.momentum = c.momentum;
  oc.nesterov = c.nesterov;
  oc.weightDecay = c.weightDecay;
  auto pa = test::optimizerParameters();
  auto pb = copies(pa);
  auto ours = createOptimizer(oc, pa);
  torch::optim::SGDOptions so(oc.lr);
  so.momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weightDecay).dampening(c.dampening);
  torch::optim::SGD reference(pb, so);
  if (c.dampening != 0) {
    for (auto& g : ours->param_groups()) {
      static_cast<torch::optim::SGDOptions&>(g.options()).dampening(c.dampening);
    }
  }
  const double before = (pa[0] - pb[0]).abs().max().item<double>();
  ASSERT_EQ(before, 0.0);
  const double diff = maxDifference(*ours, pa, reference, pb, 5);
  EXPECT_LT(diff, 1e-5);
  // The parameters did move (a step that does nothing would also match at 0).
  auto fresh = test::optimizerParameters();
  EXPECT_GT((pa[1] - fresh[1]).abs().max().item<double>(), 1e-2);
  // The state is LibTorch's: a checkpoint holds the momentum buffers.
  auto state = optimizerState(*ours, {"a", "b", "c"});
  EXPECT_EQ(state.size(), c.momentum != 0 ? 3u : 0u);
}

INSTANTIATE_TEST_SUITE_P(Options, FusedSgd,
                         ::testing::Values(Case{0.9, 0, true, 5e-4}, Case{0.9, 0, false, 0},
                                           Case{0.9, 0.1, false, 1e-3}, Case{0, 0, false, 1e-3}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           const Case& c = i.param;
                           return std::string(c.momentum == 0 ? "NoMomentum" : "Momentum") +
                                  (c.nesterov ? "Nesterov" : "") + (c.dampening != 0 ? "Dampening" : "") +
                                  (c.weightDecay != 0 ? "WeightDecay" : "");
                         });

TEST(FusedSgdState, ARestoredContiguousBufferOfAChannelsLastWeightContinuesTheSameWay) {
  OptimizerConfig oc;
  oc.name = OptimizerKind::sgd;
  oc.lr = 0.05;
  oc.momentum = 0.9;
  oc.nesterov = true;
  auto pa = test::optimizerParameters();
  auto pb = copies(pa);
  auto first = createOptimizer(oc, pa);
  torch::optim::SGD reference(pb, torch::optim::SGDOptions(oc.lr).momentum(0.9).nesterov(true));
  maxDifference(*first, pa, reference, pb, 2);
  // Save and restore into a fresh optimizer; the restored buffers come back
  // contiguous (as a checkpoint reads them).
  std::vector<std::pair<std::string, at::Tensor>> saved;
  for (auto& [name, t] : optimizerState(*first, {"a", "b", "c"})) saved.emplace_back(name, t.contiguous().clone());
  ASSERT_NE(saved[1].second.strides(), pa[1].strides());
  auto second = createOptimizer(oc, pa);
  loadOptimizerState(*second, {"a", "b", "c"}, saved, "test");
  EXPECT_LT(maxDifference(*second, pa, reference, pb, 3), 1e-5);
}

}  // namespace
}  // namespace cohort::train
