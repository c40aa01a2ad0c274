// The DDP engine within one process (world size 1): bucketing, gradient
// views, hook-driven launches, unused parameters, accumulation (with the
// buckets kept as several ranks have them); and one rank as a job runs it,
// without buckets.

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>

#include "cohort/core/error.h"
#include "cohort/parallel/ddp.h"
#include "parallel/detail/grad_copy.h"

namespace cohort::parallel {
namespace {

// Bucket cap and find_unused_parameters; the rest as DdpOptions has it.
DdpOptions options(double bucketCapMb, bool findUnusedParameters) {
  DdpOptions o;
  o.bucketCapMb = bucketCapMb;
  o.findUnusedParameters = findUnusedParameters;
  return o;
}

// The same with the buckets kept on this one rank, as several ranks have
// them: for the tests of where gradients live in the buckets.
DdpOptions bucketed(double bucketCapMb, bool findUnusedParameters) {
  DdpOptions o = options(bucketCapMb, findUnusedParameters);
  o.bucketsOnOneRank = true;
  return o;
}

comm::Comm soloComm() {
  comm::Comm c;
  c.store = c10::make_intrusive<c10d::HashStore>();
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  c.pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c.store, 0, 1, opts);
  c.timeout = std::chrono::seconds(30);
  return c;
}

struct Net : torch::nn::Module {
  explicit Net(bool withUnused = false) {
    a = register_module("a", torch::nn::Linear(4, 8));
    b = register_module("b", torch::nn::Linear(8, 3));
    if (withUnused) unused = register_module("unused", torch::nn::Linear(2, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return b(torch::relu(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr}, unused{nullptr};
};

struct ConvNet : torch::nn::Module {
  ConvNet() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)));
    fc = register_module("fc", torch::nn::Linear(4 * 3 * 3, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return fc(torch::relu(conv(x)).flatten(1)); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};

// Replaces element 7 of a.weight's gradient by `bad` until removed.
unsigned poisonAt7(Net& net, float bad) {
  return net.a->weight.register_hook([bad](const at::Tensor& g) {
    at::Tensor out = g.clone();
    out.view(-1)[7] = bad;
    return out;
  });
}

// `to` takes `from`'s parameter values (the same architecture).
void copyParameters(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard g;
  auto src = from.parameters(), dst = to.parameters();
  for (size_t k = 0; k < src.size(); ++k) dst[k].copy_(src[k]);
}

TEST(DdpLocal, BucketsInReverseRegistrationOrderWithinTheCap) {
  auto net = std::make_shared<Net>();
  DistributedDataParallel tiny(net, soloComm(), options(1e-9, false));
  EXPECT_EQ(tiny.bucketParameterNames(),
            (std::vector<std::vector<std::string>>{{"b.bias"}, {"b.weight"}, {"a.bias"}, {"a.weight"}}));
  auto net2 = std::make_shared<Net>();
  DistributedDataParallel huge(net2, soloComm(), options(1000, false));
  EXPECT_EQ(huge.bucketParameterNames(),
            (std::vector<std::vector<std::string>>{{"b.bias", "b.weight", "a.bias", "a.weight"}}));
  // a.weight is 128 bytes, b.weight 96: a 200-byte cap splits before a.weight.
  auto net3 = std::make_shared<Net>();
  DistributedDataParallel mid(net3, soloComm(), options(200.0 / (1024 * 1024), false));
  EXPECT_EQ(mid.bucketParameterNames(),
            (std::vector<std::vector<std::string>>{{"b.bias", "b.weight", "a.bias"}, {"a.weight"}}));
}

TEST(DdpLocal, GradientsMatchPlainAutogradAndLaunchDuringBackward) {
  torch::manual_seed(1);
  auto net = std::make_shared<Net>();
  auto plain = std::make_shared<Net>();
  copyParameters(*net, *plain);
  DistributedDataParallel ddp(net, soloComm(), options(1e-9, false));
  at::Tensor x = torch::randn({5, 4});
  ddp.setSyncGradients(true);
  net->forward(x).pow(2).sum().backward();
  ddp.finishGradients();
  plain->forward(x).pow(2).sum().backward();
  auto p = net->parameters(), q = plain->parameters();
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(torch::allclose(p[k].grad(), q[k].grad()));
  DdpStats s = ddp.stats();
  EXPECT_EQ(s.buckets, 4);
  EXPECT_EQ(s.launchedDuringBackward, 4) << "bucket launches must come from autograd hooks";
  EXPECT_EQ(s.launchedAtFinish, 0);
  EXPECT_EQ(s.syncs, 1);

  ddp.zeroGrad();
  for (const auto& t : net->parameters()) EXPECT_FALSE(t.grad().defined()) << "zeroGrad dropped no gradient";
}

// After zeroGrad the next backward's gradients replace the last ones (a
// copy into each bucket slot, not a sum onto them) and live in the bucket.
TEST(DdpLocal, TheNextBackwardFillsTheBucketsWithItsOwnGradients) {
  torch::manual_seed(4);
  auto net = std::make_shared<Net>();
  auto plain = std::make_shared<Net>();
  copyParameters(*net, *plain);
  DistributedDataParallel ddp(net, soloComm(), bucketed(1000, false));
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = torch::randn({5, 4});
    ddp.setSyncGradients(true);
    net->forward(x).pow(2).sum().backward();
    ddp.finishGradients();
    plain->zero_grad();
    plain->forward(x).pow(2).sum().backward();
    const auto* base = static_cast<const char*>(net->b->bias.grad().data_ptr());
    auto p = net->parameters(), q = plain->parameters();
    for (size_t k = 0; k < p.size(); ++k) {
      EXPECT_TRUE(torch::equal(p[k].grad(), q[k].grad())) << "step " << step << ", parameter " << k;
      const auto* at = static_cast<const char*>(p[k].grad().data_ptr());
      EXPECT_TRUE(at >= base && at < base + (3 + 24 + 8 + 32) * sizeof(float))
          << "step " << step << ": parameter " << k << "'s gradient left the bucket";
    }
    ddp.zeroGrad();
  }
}

// On one rank the copies into the buckets check every element: a NaN or
// Inf anywhere is found without another pass over the buckets, and the
// verdict is fresh each step.
TEST(DdpLocal, OneRankFindsANonFiniteGradientInTheCopyIntoItsBucket) {
  torch::manual_seed(5);
  auto net = std::make_shared<Net>();
  DistributedDataParallel ddp(net, soloComm(), bucketed(1e-9, false));
  // Step 0 accumulates into the buckets as built (unchecked); then a NaN,
  // +Inf and -Inf in one element of a.weight's gradient; then none.
  const float poison[] = {0.0f, std::nanf(""), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), 0.0f};
  for (int step = 0; step < 5; ++step) {
    const float bad = poison[step];
    const unsigned hook = poisonAt7(*net, bad);
    ddp.setSyncGradients(true);
    net->forward(torch::randn({3, 4})).sum().backward();
    ddp.finishGradients();
    const bool expectFinite = std::isfinite(bad);
    EXPECT_EQ(ddp.gradientsFinite(), expectFinite) << "step " << step;
    net->a->weight.remove_hook(hook);
    ddp.zeroGrad();
  }
  EXPECT_EQ(ddp.stats().finitenessPasses, 1) << "only the first step should read the buckets again";
}

// The copy's check, over more elements than one chunk of the parallel loop
// takes: each kind of non-finite value in the first, a middle and the last
// element is found; the largest finite floats are not; a copy it cannot
// check says so and still copies.
TEST(GradCopy, EveryNonFiniteElementIsFoundWhereverItIs) {
  const int64_t n = (1 << 17) + 3;
  const at::Tensor base = torch::randn({n});
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const int64_t where : {int64_t{0}, n / 2, n - 1}) {
      at::Tensor src = base.clone();
      src[where] = bad;
      at::Tensor dst = torch::zeros({n});
      EXPECT_EQ(detail::copyCheckingFinite(dst, src), std::optional<bool>(false)) << bad << " at " << where;
      EXPECT_TRUE(torch::equal(dst.isnan(), src.isnan()));
    }
  }
  at::Tensor src = base.clone();
  src[0] = std::numeric_limits<float>::max();
  src[n - 1] = -std::numeric_limits<float>::max();
  src[1] = std::numeric_limits<float>::denorm_min();
  at::Tensor dst = torch::zeros({n});
  EXPECT_EQ(detail::copyCheckingFinite(dst, src), std::optional<bool>(true));
  EXPECT_TRUE(torch::equal(dst, src));
  // Channels-last on both sides: checked; the layouts differ: copied only.
  at::Tensor img = torch::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor same = torch::empty_like(img);
  EXPECT_EQ(detail::copyCheckingFinite(same, img), std::optional<bool>(true));
  EXPECT_TRUE(torch::equal(same, img));
  at::Tensor other = torch::empty({2, 3, 4, 5});
  img[1][2][3][4] = std::nanf("");
  EXPECT_EQ(detail::copyCheckingFinite(other, img), std::nullopt);
  EXPECT_TRUE(torch::equal(other.isnan(), img.isnan()));
  // A 1x1 convolution's channels-last weight and a gradient whose size-1
  // dimensions have other strides: the same memory order, so checked.
  at::Tensor view = torch::empty_strided({8, 4, 1, 1}, {4, 1, 4, 4});
  at::Tensor grad = torch::randn({8, 4, 1, 1});
  ASSERT_NE(view.strides(), grad.strides());
  EXPECT_EQ(detail::copyCheckingFinite(view, grad), std::optional<bool>(true));
  EXPECT_TRUE(torch::equal(view, grad));
  grad[5][2][0][0] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(detail::copyCheckingFinite(view, grad), std::optional<bool>(false));
}

// The check alone (one rank without buckets): the same verdicts, nothing
// written; a tensor it cannot read as plain floats is left unchecked.
TEST(GradCopy, TheCheckAloneFindsEveryNonFiniteElement) {
  const int64_t n = (1 <<17) + 3;
  const at::Tensor base = torch::randn({n});
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const int64_t where : {int64_t{0}, int64_t{1} << 15, n / 2, n - 1}) {
      at::Tensor t = base.clone();
      t[where] = bad;
      EXPECT_EQ(detail::allFinite(t), std::optional<bool>(false)) << bad << " at " << where;
    }
  }
  at::Tensor t = base.clone();
  t[0] = std::numeric_limits<float>::max();
  t[n - 1] = -std::numeric_limits<float>::max();
  t[1] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(detail::allFinite(t), std::optional<bool>(true));
  at::Tensor img = torch::randn({2, 3, 4, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_EQ(detail::allFinite(img), std::optional<bool>(true));
  img[1][2][3][4] = std::nanf("");
  EXPECT_EQ(detail::allFinite(img), std::optional<bool>(false));
  EXPECT_EQ(detail::allFinite(torch::randn({4, 4}).t().slice(0, 0, 4, 2)), std::nullopt);
  EXPECT_EQ(detail::allFinite(torch::randn({8}, torch::kDouble)), std::nullopt);
}

TEST(DdpLocal, AccumulationSkipsExchangeAndSumsGradients) {
  torch::manual_seed(2);
  auto net = std::make_shared<Net>();
  DistributedDataParallel ddp(net, soloComm(), bucketed(25, false));
  at::Tensor x = torch::randn({6, 4});
  ddp.setSyncGradients(false);
  net->forward(x).sum().backward();
  ddp.finishGradients();  // no-op on an inner micro-step
  EXPECT_EQ(ddp.stats().syncs, 0);
  EXPECT_EQ(ddp.stats().launchedDuringBackward, 0);
  at::Tensor once = net->a->weight.grad().clone();
  // Already in the bucket (a.weight is its last): no second copy of the
  // gradients through the micro-steps.
  const auto* base = static_cast<const char*>(net->b->bias.grad().data_ptr());
  EXPECT_EQ(static_cast<const char*>(net->a->weight.grad().data_ptr()), base + (3 + 24 + 8) * sizeof(float));
  ddp.setSyncGradients(true);
  net->forward(x).sum().backward();
  ddp.finishGradients();
  EXPECT_TRUE(torch::allclose(net->a->weight.grad(), 2 * once));
  EXPECT_EQ(ddp.stats().syncs, 1);
}

TEST(DdpLocal, UnusedParameterIsAnErrorNamingIt) {
  auto net = std::make_shared<Net>(true);
  DistributedDataParallel ddp(net, soloComm(), options(25, false));
  ddp.setSyncGradients(true);
  net->forward(torch::randn({2, 4})).sum().backward();
  try {
    ddp.finishGradients();
    FAIL() << "no error for an unused parameter";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'unused."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos);
  }
}

TEST(DdpLocal, UnusedParameterAllowedUnderTheFlag) {
  auto net = std::make_shared<Net>(true);
  DistributedDataParallel ddp(net, soloComm(), options(1e-9, true));
  for (int step = 0; step < 3; ++step) {
    // Step 1 uses the extra layer: at step 2 its slot must hold zeros, not
    // step 1's gradient.
    ddp.setSyncGradients(true);
    at::Tensor loss = net->forward(torch::randn({2, 4})).sum();
    if (step == 1) loss = loss + net->unused->forward(torch::randn({1, 2})).sum();
    loss.backward();
    ddp.finishGradients();
    const float size = net->unused->weight.grad().abs().sum().item<float>();
    if (step == 1) {
      EXPECT_GT(size, 0.0f);
    } else {
      EXPECT_EQ(size, 0.0f) << "step " << step;
    }
    ddp.zeroGrad();
  }
  EXPECT_EQ(ddp.stats().syncs, 3);
  EXPECT_GT(ddp.stats().launchedAtFinish, 0);
}

TEST(DdpLocal, ReplacedGradientIsPutBackIntoItsBucket) {
  auto net = std::make_shared<Net>();
  DistributedDataParallel ddp(net, soloComm(), bucketed(25, false));
  net->a->weight.mutable_grad() = at::Tensor();  // what zero_grad(set_to_none) does
  ddp.setSyncGradients(true);
  net->forward(torch::randn({3, 4})).sum().backward();
  ddp.finishGradients();
  EXPECT_GT(net->a->weight.grad().abs().sum().item<float>(), 0.0f);
  const auto* bucket = static_cast<const char*>(net->b->bias.grad().data_ptr());
  const auto* at = static_cast<const char*>(net->a->weight.grad().data_ptr());
  EXPECT_TRUE(at >= bucket && at < bucket + (3 + 24 + 8 + 32) * sizeof(float));
}

// Channels-last weights (what model.memory_format gives convolutions): each
// gradient lives in its bucket with the weight's own strides, so autograd
// writes it in place, and the values are plain autograd's.
TEST(DdpLocal, ChannelsLastWeightsGetGradientsInTheirBucketWithTheirStrides) {
  torch::manual_seed(3);
  auto net = std::make_shared<ConvNet>();
  auto plain = std::make_shared<ConvNet>();
  copyParameters(*net, *plain);
  {
    torch::NoGradGuard g;
    net->conv->weight.set_data(net->conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
  }
  ASSERT_FALSE(net->conv->weight.is_contiguous());
  DistributedDataParallel ddp(net, soloComm(), bucketed(1000, false));
  at::Tensor x = torch::randn({2, 3, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast);
  for (int step = 0; step < 2; ++step) {
    ddp.setSyncGradients(true);
    net->forward(x).pow(2).sum().backward();
    ddp.finishGradients();
  }
  plain->forward(x.contiguous()).pow(2).sum().backward();
  plain->forward(x.contiguous()).pow(2).sum().backward();
  const at::Tensor& g = net->conv->weight.grad();
  EXPECT_EQ(g.strides(), net->conv->weight.strides());
  // The gradient is the bucket's memory, not a copy: one bucket holds all.
  const auto* base = static_cast<const char*>(net->fc->bias.grad().data_ptr());
  const auto* at = static_cast<const char*>(g.data_ptr());
  const size_t floats = 2 + 2 * 36 + 4 + 4 * 27;
  EXPECT_TRUE(at >= base && at < base + floats * sizeof(float)) << "conv.weight's gradient left its bucket";
  EXPECT_TRUE(torch::allclose(g, plain->conv->weight.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(net->fc->weight.grad(), plain->fc->weight.grad(), 1e-5, 1e-6));
}

// One rank at stage 0, as a job runs it: no buckets. Each gradient is the
// tensor autograd made (its own storage, no copy), equal to plain
// autograd's; the next backward replaces it; each step's NaN or Inf is
// found as the gradient arrives, with no pass of its own.
TEST(DdpOneRank, GradientsStayAutogradsAndAreCheckedAsTheyArrive) {
  torch::manual_seed(6);
  auto net = std::make_shared<Net>();
  auto plain = std::make_shared<Net>();
  copyParameters(*net, *plain);
  DistributedDataParallel ddp(net, soloComm(), options(1000, false));
  const float poison[] = {0.0f, std::nanf(""), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), 0.0f};
  for (int step = 0; step < 5; ++step) {
    const float bad = poison[step];
    const std::optional<unsigned> hook = std::isfinite(bad) ? std::nullopt : std::optional(poisonAt7(*net, bad));
    at::Tensor x = torch::randn({5, 4});
    ddp.setSyncGradients(true);
    net->forward(x).pow(2).sum().backward();
    ddp.finishGradients();
    EXPECT_EQ(ddp.gradientsFinite(), std::isfinite(bad)) << "step " << step;
    if (hook) net->a->weight.remove_hook(*hook);
    plain->zero_grad();
    plain->forward(x).pow(2).sum().backward();
    auto p = net->parameters(), q = plain->parameters();
    for (size_t k = 0; k < p.size(); ++k) {
      if (std::isfinite(bad)) {
        EXPECT_TRUE(torch::equal(p[k].grad(), q[k].grad())) << "step " << step << ", " << k;
      }
      EXPECT_EQ(p[k].grad().storage().nbytes(), p[k].numel() * sizeof(float))
          << "step " << step << ": parameter " << k << "'s gradient is part of a larger buffer";
    }
    ddp.zeroGrad();
    for (const auto& t : net->parameters()) EXPECT_FALSE(t.grad().defined());
  }
  EXPECT_EQ(ddp.stats().finitenessPasses, 0) << "every step's verdict came from the checks on arrival";
}

// Micro-steps add onto autograd's gradient; the check is of their sum, at
// the step that synchronizes: a NaN from an inner micro-step is found.
TEST(DdpOneRank, MicroStepsSumAndTheSumIsChecked) {
  torch::manual_seed(7);
  auto net = std::make_shared<Net>();
  DistributedDataParallel ddp(net, soloComm(), options(25, false));
  const at::Tensor x = torch::randn({6, 4});
  for (const float bad : {std::nanf(""), 0.0f}) {
    const std::optional<unsigned> hook = std::isfinite(bad) ? std::nullopt : std::optional(poisonAt7(*net, bad));
    ddp.setSyncGradients(false);
    net->forward(x).sum().backward();
    ddp.finishGradients();  // nothing to do on an inner micro-step
    if (hook) net->a->weight.remove_hook(*hook);
    const at::Tensor once = net->a->weight.grad().clone();
    ddp.setSyncGradients(true);
    net->forward(x).sum().backward();
    ddp.finishGradients();
    EXPECT_EQ(ddp.gradientsFinite(), std::isfinite(bad));
    if (std::isfinite(bad)) {
      EXPECT_TRUE(torch::allclose(net->a->weight.grad(), 2 * once));
    }
    ddp.zeroGrad();
  }
  EXPECT_EQ(ddp.stats().syncs, 2);
  EXPECT_EQ(ddp.stats().finitenessPasses, 0);
}

// Clipping's norm and scale reach every gradient without buckets, the
// channels-last weight's in its own layout.
TEST(DdpOneRank, NormAndScaleReachEveryGradient) {
  torch::manual_seed(8);
  auto net = std::make_shared<ConvNet>();
  {
    torch::NoGradGuard g;
    net->conv->weight.set_data(net->conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
  }
  DistributedDataParallel ddp(net, soloComm(), options(1000, false));
  ddp.setSyncGradients(true);
  net->forward(torch::randn({2, 3, 5, 5}).contiguous(at::MemoryFormat::ChannelsLast)).pow(2).sum().backward();
  ddp.finishGradients();
  double expected = 0;
  std::vector<at::Tensor> before;
  for (const auto& p : net->parameters()) {
    expected += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    before.push_back(p.grad().clone());
  }
  ASSERT_GT(expected, 0);
  EXPECT_NEAR(ddp.gradientSquaredNorm(), expected, 1e-5 * expected);
  ddp.scaleGradients(0.5);
  auto p = net->parameters();
  for (size_t k = 0; k < p.size(); ++k) EXPECT_TRUE(torch::allclose(p[k].grad(), 0.5 * before[k])) << k;
  EXPECT_EQ(net->conv->weight.grad().strides(), net->conv->weight.strides());
}

}  // namespace
}  // namespace cohort::parallel
