// The DDP engine within one process (world size 1): bucketing, gradient
// views, hook-driven launches, unused parameters, accumulation.

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include "cohort/core/error.h"
#include "cohort/parallel/ddp.h"

namespace cohort::parallel {
namespace {

// Bucket cap and find_unused_parameters; the rest as DdpOptions has it.
DdpOptions options(double bucketCapMb, bool findUnusedParameters) {
  DdpOptions o;
  o.bucketCapMb = bucketCapMb;
  o.findUnusedParameters = findUnusedParameters;
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
  {
    torch::NoGradGuard g;
    auto src = net->parameters(), dst = plain->parameters();
    for (size_t k = 0; k < src.size(); ++k) dst[k].copy_(src[k]);
  }
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
  for (const auto& t : net->parameters()) EXPECT_EQ(t.grad().abs().sum().item<float>(), 0.0f);
}

TEST(DdpLocal, AccumulationSkipsExchangeAndSumsGradients) {
  torch::manual_seed(2);
  auto net = std::make_shared<Net>();
  DistributedDataParallel ddp(net, soloComm(), options(25, false));
  at::Tensor x = torch::randn({6, 4});
  ddp.setSyncGradients(false);
  net->forward(x).sum().backward();
  ddp.finishGradients();  // no-op on an inner micro-step
  EXPECT_EQ(ddp.stats().syncs, 0);
  EXPECT_EQ(ddp.stats().launchedDuringBackward, 0);
  at::Tensor once = net->a->weight.grad().clone();
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
  for (int step = 0; step < 2; ++step) {
    ddp.setSyncGradients(true);
    net->forward(torch::randn({2, 4})).sum().backward();
    ddp.finishGradients();
    ddp.zeroGrad();
  }
  EXPECT_EQ(net->unused->weight.grad().abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(ddp.stats().syncs, 2);
  EXPECT_GT(ddp.stats().launchedAtFinish, 0);
}

TEST(DdpLocal, ReplacedGradientIsPutBackIntoItsBucket) {
  auto net = std::make_shared<Net>();
  DistributedDataParallel ddp(net, soloComm(), options(25, false));
  net->a->weight.mutable_grad() = at::Tensor();  // what zero_grad(set_to_none) does
  ddp.setSyncGradients(true);
  net->forward(torch::randn({3, 4})).sum().backward();
  ddp.finishGradients();
  EXPECT_GT(net->a->weight.grad().abs().sum().item<float>(), 0.0f);
  ddp.zeroGrad();
  EXPECT_EQ(net->a->weight.grad().abs().sum().item<float>(), 0.0f);
}

// Channels-last weights (what model.memory_format gives convolutions): each
// gradient lives in its bucket with the weight's own strides, so autograd
// writes it in place, and the values are plain autograd's.
TEST(DdpLocal, ChannelsLastWeightsGetGradientsInTheirBucketWithTheirStrides) {
  struct ConvNet : torch::nn::Module {
    ConvNet() {
      conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)));
      fc = register_module("fc", torch::nn::Linear(4 * 3 * 3, 2));
    }
    at::Tensor forward(const at::Tensor& x) { return fc(torch::relu(conv(x)).flatten(1)); }
    torch::nn::Conv2d conv{nullptr};
    torch::nn::Linear fc{nullptr};
  };
  torch::manual_seed(3);
  auto net = std::make_shared<ConvNet>();
  auto plain = std::make_shared<ConvNet>();
  {
    torch::NoGradGuard g;
    auto src = net->parameters(), dst = plain->parameters();
    for (size_t k = 0; k < src.size(); ++k) dst[k].copy_(src[k]);
    net->conv->weight.set_data(net->conv->weight.contiguous(at::MemoryFormat::ChannelsLast));
  }
  ASSERT_FALSE(net->conv->weight.is_contiguous());
  DistributedDataParallel ddp(net, soloComm(), options(1000, false));
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

}  // namespace
}  // namespace cohort::parallel
