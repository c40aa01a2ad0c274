#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "cohort/train/optimizer.h"
#include "train/detail/fused_sgd_arrays.h"
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
#if defined(__x86_64__)
  // The AVX2 build does LibTorch's operations with the multiply-adds of
  // ATen's own AVX2 and AVX-512 kernels: the same bits.
  const char* held = std::getenv("ATEN_CPU_CAPABILITY");  // "default": ATen's generic vectors
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      (held == nullptr || std::string(held) != "default")) {
    EXPECT_EQ(diff, 0.0);
  }
#endif
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

// The loop's builds (baseline, and AVX2 with FMA where the CPU has them)
// against LibTorch's arithmetic in double, on sizes around the vector
// widths; a range cut in two pieces anywhere gives the same bits as one.
TEST(FusedSgdLoop, EveryBuildStepsEveryElementAlike) {
  using Update = void (*)(const detail::SgdArrays&, const detail::SgdScalars&, int64_t, int64_t);
  std::vector<std::pair<const char*, Update>> builds = {{"baseline", detail::sgdUpdateBaseline}};
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) builds.emplace_back("avx2", detail::sgdUpdateAvx2);
#endif
  torch::manual_seed(11);
  for (const int64_t n : {1, 7, 8, 9, 16, 17, 37, 1003}) {
    const at::Tensor p0 = torch::randn({n}), g = torch::randn({n}), b0 = torch::randn({n});
    for (const bool momentum : {false, true}) {
      for (const bool first : {false, true}) {
        for (const bool nesterov : {false, true}) {
          detail::SgdScalars s;
          s.lr = 0.05f;
          s.weightDecay = nesterov ? 1e-3f : 0.0f;
          s.momentum = momentum ? 0.9f : 0.0f;
          s.keep = first ? 1.0f : 0.9f;
          s.nesterov = nesterov && momentum;
          s.firstStep = first && momentum;
          // LibTorch's operations in double.
          const at::Tensor pd = p0.to(at::kDouble), gd = g.to(at::kDouble);
          at::Tensor d = gd + s.weightDecay * pd, step = d, bd;
          if (momentum) {
            bd = s.firstStep ? d : b0.to(at::kDouble) * s.momentum + s.keep * d;
            step = s.nesterov ? d + s.momentum * bd : bd;
          }
          const at::Tensor want = pd - s.lr * step;
          for (const auto& [name, update] : builds) {
            const std::string what = std::string(name) + " n " + std::to_string(n) + (momentum ? " momentum" : "") +
                                     (s.firstStep ? " first" : "") + (s.nesterov ? " nesterov" : "");
            at::Tensor p = p0.clone(), b = b0.clone();
            detail::SgdArrays a{p.data_ptr<float>(), g.data_ptr<float>(), momentum ? b.data_ptr<float>() : nullptr};
            update(a, s, 0, n);
            EXPECT_LT((p.to(at::kDouble) - want).abs().max().item<double>(), 1e-6) << what;
            if (momentum) {
              EXPECT_LT((b.to(at::kDouble) - bd).abs().max().item<double>(), 1e-6) << what;
            } else {
              EXPECT_TRUE(torch::equal(b, b0)) << what << ": the buffer was written";
            }
            for (const int64_t cut : {int64_t{1}, n / 2, n - 1}) {
              if (cut <= 0 || cut >= n) continue;
              at::Tensor q = p0.clone(), c = b0.clone();
              detail::SgdArrays pieces{q.data_ptr<float>(), g.data_ptr<float>(), momentum ? c.data_ptr<float>() : nullptr};
              update(pieces, s, 0, cut);
              update(pieces, s, cut, n);
              EXPECT_TRUE(torch::equal(q, p)) << what << ", cut at " << cut;
              EXPECT_TRUE(torch::equal(c, b)) << what << ", cut at " << cut;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace cohort::train
