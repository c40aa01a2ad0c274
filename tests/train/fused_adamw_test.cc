// The fused AdamW step (train/detail/fused_adamw.h) against LibTorch's
// torch::optim::AdamW on copies of the same parameters fed the same
// gradients: float32 parameters agree within kRelative of the reference
// (plus kAbsolute for values near zero) after kSteps steps, and the ones it
// leaves to LibTorch's operations (double, non-dense) agree bitwise.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/train/optimizer.h"
#include "util/optimizer_parameters.h"
#include "train/detail/fused_adamw.h"
#include "train/detail/fused_adamw_loop.h"

// A namespace of its own: the tests' unity batches put this file beside
// optimizer_test.cc.
namespace cohort::train::fused_adamw_test {
namespace {

constexpr int kSteps = 40;
constexpr double kRelative = 1e-6;
constexpr double kAbsolute = 1e-7;

std::vector<at::Tensor> copies(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const auto& p : ps) {
    at::Tensor c = at::empty_strided(p.sizes(), p.strides(), p.options().requires_grad(false));
    c.copy_(p.detach());
    c.set_requires_grad(true);
    out.push_back(c);
  }
  return out;
}

// The same fresh gradient for pa[k] and pb[k] (laid out as the parameter
// suggests), except for parameters listed in `skip`, which get none. The
// second parameter's are tiny, so that eps weighs in its denominators.
void feed(std::vector<at::Tensor>& pa, std::vector<at::Tensor>& pb, const std::vector<size_t>& skip = {}) {
  for (size_t k = 0; k < pa.size(); ++k) {
    if (std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
    at::Tensor g = torch::randn(pa[k].sizes(), pa[k].options().requires_grad(false));
    if (k == 1) g.mul_(1e-8);
    pa[k].mutable_grad() = g.clone().contiguous(pa[k].suggest_memory_format());
    pb[k].mutable_grad() = g.clone().contiguous(pb[k].suggest_memory_format());
  }
}

// The largest |a - b| / (kAbsolute + kRelative |b|) over all elements: at
// most 1 when the two agree within the tolerance.
double worstOverTolerance(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  at::Tensor da = a.detach().to(torch::kFloat64), db = b.detach().to(torch::kFloat64);
  return ((da - db).abs() / (kAbsolute + kRelative * db.abs())).max().item<double>();
}

// Restores LibTorch's thread count: the tests of this program share it.
struct ThreadsGuard {
  int before = at::get_num_threads();
  ~ThreadsGuard() { at::set_num_threads(before); }
};

torch::optim::AdamWOptions options(bool amsgrad, double weightDecay) {
  return torch::optim::AdamWOptions(3e-3).betas({0.9, 0.999}).eps(1e-8).weight_decay(weightDecay).amsgrad(amsgrad);
}

struct Case {
  bool amsgrad;
  double weightDecay;
};

void PrintTo(const Case& c, std::ostream* out) {
  *out << "amsgrad " << c.amsgrad << ", weight decay " << c.weightDecay;
}

class FusedAdamW : public ::testing::TestWithParam<Case> {};

// Odd sizes (the vector loop's tails), an empty tensor, a matrix, a
// channels-last weight, and many small tensors stepped in one region.
TEST_P(FusedAdamW, MatchesLibTorchsAdamWWithinTolerance) {
  const Case c = GetParam();
  torch::manual_seed(11);
  std::vector<at::Tensor> pa;
  for (int64_t n : {1, 7, 1031, 65537, 0}) pa.push_back(torch::randn({n}));
  pa.push_back(torch::randn({37, 11}));
  pa.push_back(torch::randn({8, 3, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast));
  for (int k = 0; k < 60; ++k) pa.push_back(torch::randn({1 + (k * 7) % 50}));
  for (auto& p : pa) p.set_requires_grad(true);
  auto pb = copies(pa);
  const auto initial = copies(pa);
  detail::FusedAdamW fused(pa, options(c.amsgrad, c.weightDecay));
  torch::optim::AdamW reference(pb, options(c.amsgrad, c.weightDecay));
  ThreadsGuard threads;
  // The fused step on two threads (its walk cut in two pieces), LibTorch's
  // on one: elementwise operations give the same results on any number,
  // and its many small parallel regions are slow on a busy machine.
  for (int s = 0; s < kSteps; ++s) {
    feed(pa, pb);
    at::set_num_threads(2);
    fused.step();
    at::set_num_threads(1);
    reference.step();
  }
  double worst = 0;
  for (size_t k = 0; k < pa.size(); ++k) worst = std::max(worst, worstOverTolerance(pa[k], pb[k]));
  EXPECT_LE(worst, 1.0) << "worst difference in units of the tolerance";
  RecordProperty("worst_in_units_of_tolerance", std::to_string(worst));
  // The state agrees too, under LibTorch's keys and types.
  ASSERT_EQ(fused.state().size(), reference.state().size());
  for (size_t k = 0; k < pa.size(); ++k) {
    const std::string ka = c10::guts::to_string(pa[k].unsafeGetTensorImpl());
    const std::string kb = c10::guts::to_string(pb[k].unsafeGetTensorImpl());
    auto& sa = static_cast<torch::optim::AdamWParamState&>(*fused.state().at(ka));
    auto& sb = static_cast<torch::optim::AdamWParamState&>(*reference.state().at(kb));
    EXPECT_EQ(sa.step(), kSteps);
    EXPECT_LE(worstOverTolerance(sa.exp_avg(), sb.exp_avg()), 1.0) << k;
    EXPECT_LE(worstOverTolerance(sa.exp_avg_sq(), sb.exp_avg_sq()), 1.0) << k;
    EXPECT_EQ(sa.max_exp_avg_sq().defined(), c.amsgrad);
    if (c.amsgrad) {
      EXPECT_LE(worstOverTolerance(sa.max_exp_avg_sq(), sb.max_exp_avg_sq()), 1.0) << k;
    }
  }
  // The parameters did move (a step that does nothing would match too).
  EXPECT_GT((pa[3] - initial[3]).abs().max().item<double>(), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Options, FusedAdamW,
                         ::testing::Values(Case{false, 0}, Case{false, 1e-2}, Case{true, 0}, Case{true, 1e-2}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.amsgrad ? "Amsgrad" : "Adam") +
                                  (i.param.weightDecay != 0 ? "WeightDecay" : "NoDecay");
                         });

// Parameters the loop does not take get LibTorch's operations, so exactly
// AdamW's results; a parameter without a gradient is left alone.
TEST(FusedAdamWFallback, OtherParametersGetExactlyAdamWsResult) {
  torch::manual_seed(5);
  std::vector<at::Tensor> pa;
  pa.push_back(torch::randn({13}, torch::kFloat64));
  // Every other column of a matrix: not dense.
  pa.push_back(torch::randn({9, 14}).slice(1, 0, 14, 2));
  pa.push_back(torch::randn({33}, torch::kBFloat16));
  pa.push_back(torch::randn({17}));  // never gets a gradient
  pa.push_back(torch::randn({19}));  // fused, beside them
  for (auto& p : pa) p.set_requires_grad(true);
  ASSERT_FALSE(pa[1].is_non_overlapping_and_dense());
  auto pb = copies(pa);
  const auto initial = copies(pa);
  detail::FusedAdamW fused(pa, options(true, 1e-2));
  torch::optim::AdamW reference(pb, options(true, 1e-2));
  for (int s = 0; s < 5; ++s) {
    feed(pa, pb, {3});
    fused.step();
    reference.step();
  }
  EXPECT_TRUE(torch::equal(pa[0], pb[0]));
  EXPECT_TRUE(torch::equal(pa[1], pb[1]));
  EXPECT_TRUE(torch::equal(pa[2], pb[2]));
  EXPECT_TRUE(torch::equal(pa[3], initial[3]));
  EXPECT_EQ(fused.state().count(c10::guts::to_string(pa[3].unsafeGetTensorImpl())), 0u);
  EXPECT_LE(worstOverTolerance(pa[4], pb[4]), 1.0);
  EXPECT_FALSE(torch::equal(pa[0], initial[0]));
  EXPECT_FALSE(torch::equal(pa[1], initial[1]));
}

TEST(FusedAdamWFallback, ASparseGradientIsAnErrorAsInLibTorch) {
  at::Tensor p = torch::randn({4}).set_requires_grad(true);
  detail::FusedAdamW fused({p}, options(false, 0));
  p.mutable_grad() = torch::eye(4).index({0}).to_sparse();
  EXPECT_THROW(fused.step(), c10::Error);
}

// The multi-tensor walk cut anywhere gives what one pass per tensor gives;
// the generic-vector loop agrees with the dispatched one.
TEST(FusedAdamWKernel, PiecesOfAnySizeGiveTheSameResult) {
  torch::manual_seed(2);
  std::vector<int64_t> sizes = {1, 7, 3, 1031, 16, 65537, 9};
  auto run = [&](int64_t grain) {
    torch::manual_seed(2);
    std::vector<at::Tensor> keep;
    std::vector<detail::AdamWTask> tasks;
    for (size_t k = 0; k < sizes.size(); ++k) {
      detail::AdamWTask t;
      at::Tensor p = torch::randn({sizes[k]}), g = torch::randn({sizes[k]});
      at::Tensor m = torch::randn({sizes[k]}) * 0.1, v = torch::rand({sizes[k]}), mx = torch::rand({sizes[k]});
      keep.insert(keep.end(), {p, g, m, v, mx});
      t.arrays = {p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                  k % 2 == 0 ? mx.data_ptr<float>() : nullptr, sizes[k]};
      t.scalars = detail::adamwScalars(options(k % 2 == 0, 1e-2), 1 + static_cast<int64_t>(k));
      tasks.push_back(t);
    }
    if (grain == 0) {
      for (const auto& t : tasks) detail::adamwUpdate(t.arrays, t.scalars, 0, t.arrays.size);
    } else if (grain < 0) {
      for (const auto& t : tasks) detail::adamwLoop(t.arrays, t.scalars, 0, t.arrays.size);
    } else {
      detail::adamwMultiTensor(tasks, grain);
    }
    return keep;
  };
  ThreadsGuard threads;
  at::set_num_threads(2);
  const auto whole = run(0);
  for (int64_t grain : {1, 5, 1000, 1 << 20}) {
    const auto cut = run(grain);
    for (size_t i = 0; i < whole.size(); ++i) EXPECT_TRUE(torch::equal(whole[i], cut[i])) << grain << " " << i;
  }
  // The loop on ATen's generic vectors (this file includes it without
  // CPU_CAPABILITY_AVX2), which a CPU without AVX2 runs, within the
  // tolerance of the one on AVX2 vectors (a multiply-add may round twice).
  const auto generic = run(-1);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_LE(worstOverTolerance(generic[i], whole[i]), 1.0) << i;
}

// createOptimizer's adamw is the fused one; its state saved (as a
// checkpoint holds it: contiguous copies) and restored into a fresh one
// continues as an uninterrupted LibTorch AdamW; the state cache of the
// checkpoints still hands out the live state after the restored
// channels-last averages were relaid.
TEST(FusedAdamWState, ARestoredStateContinuesAsLibTorchsAdamW) {
  OptimizerConfig oc;
  oc.name = OptimizerKind::adamw;
  oc.lr = 1e-2;
  oc.weightDecay = 1e-2;
  const std::vector<std::string> names = {"a", "b", "c"};
  auto pa = test::optimizerParameters();
  auto pb = copies(pa);
  auto first = createOptimizer(oc, pa);
  ASSERT_NE(dynamic_cast<detail::FusedAdamW*>(first.get()), nullptr);
  torch::optim::AdamWOptions ro(oc.lr);
  ro.betas({oc.betas.at(0), oc.betas.at(1)}).eps(oc.eps).weight_decay(oc.weightDecay);
  torch::optim::AdamW reference(pb, ro);
  for (int s = 0; s < 3; ++s) {
    feed(pa, pb);
    first->step();
    reference.step();
  }
  EXPECT_GT(optimizerStateBytes(*first), 0);
  EXPECT_EQ(optimizerStateBytes(*first), optimizerStateBytes(reference));
  std::vector<std::pair<std::string, at::Tensor>> saved;
  for (auto& [name, t] : optimizerState(*first, names)) saved.emplace_back(name, t.contiguous().clone());
  ASSERT_EQ(saved.size(), 9u);
  ASSERT_NE(saved[4].second.strides(), pa[1].strides());  // b.exp_avg, contiguous
  auto second = createOptimizer(oc, pa);
  loadOptimizerState(*second, names, saved, "test");
  OptimizerStateCache cache(*second, names);
  cache.get();  // its list, made before the restored averages are relaid
  for (int s = 0; s < 4; ++s) {
    feed(pa, pb);
    second->step();
    reference.step();
  }
  for (size_t k = 0; k < pa.size(); ++k) EXPECT_LE(worstOverTolerance(pa[k], pb[k]), 1.0) << k;
  const auto& after = cache.get();
  const auto live = optimizerState(*second, names);
  ASSERT_EQ(after.size(), live.size());
  for (size_t i = 0; i < live.size(); ++i) {
    EXPECT_EQ(after[i].first, live[i].first);
    EXPECT_TRUE(torch::equal(after[i].second, live[i].second)) << live[i].first;
  }
  EXPECT_EQ(after[3].second.item<int64_t>(), 7);  // b.step
  EXPECT_EQ(after[4].second.strides(), pa[1].strides());  // relaid in place
}

}  // namespace
}  // namespace cohort::train::fused_adamw_test
