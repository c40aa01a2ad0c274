#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/ckpt/state_dict.h"
#include "cohort/core/error.h"
#include "cohort/models/model.h"
#include "util/process.h"

namespace cohort::models {
namespace {

ModelConfig arch(const std::string& a, int64_t classes) {
  ModelConfig c;
  c.arch = choiceFromName<ModelArch>(a).value();
  c.numClasses = classes;
  return c;
}

TEST(Models, ResNetParameterCountsMatchTorchvision) {
  // torchvision.models.resnetXX(num_classes=1000): sum(p.numel() for p in m.parameters())
  EXPECT_EQ(parameterCount(*createModel(arch("resnet50", 1000), {3, 224, 224})), 25557032);
  EXPECT_EQ(parameterCount(*createModel(arch("resnet18", 1000), {3, 224, 224})), 11689512);
  EXPECT_EQ(parameterCount(*createModel(arch("resnet34", 1000), {3, 224, 224})), 21797672);
  EXPECT_EQ(parameterCount(*createModel(arch("resnet101", 1000), {3, 224, 224})), 44549160);
}

TEST(Models, ResNetStateDictNamesFollowTorchvision) {
  auto m = createModel(arch("resnet50", 10), {3, 64, 64});
  auto sd = ckpt::stateDict(*m);
  // resnet50 state_dict(): 320 entries, first and last as torchvision orders them.
  EXPECT_EQ(sd.size(), 320u);
  EXPECT_EQ(sd.front().first, "conv1.weight");
  EXPECT_EQ(sd[1].first, "bn1.weight");
  EXPECT_EQ(sd[5].first, "bn1.num_batches_tracked");
  EXPECT_EQ(sd[6].first, "layer1.0.conv1.weight");
  EXPECT_EQ(sd.back().first, "fc.bias");
  bool hasDownsample = false;
  for (const auto& [name, t] : sd) {
    if (name == "layer2.0.downsample.1.running_var") hasDownsample = true;
  }
  EXPECT_TRUE(hasDownsample);
}

TEST(Models, ForwardShapes) {
  auto cnn = createModel(arch("simple_cnn", 10), {1, 28, 28});
  EXPECT_EQ(cnn->forward(torch::zeros({3, 1, 28, 28})).sizes(), (std::vector<int64_t>{3, 10}));
  ModelConfig small = arch("resnet18", 7);
  small.smallInput = true;
  auto r = createModel(small, {1, 28, 28});
  EXPECT_EQ(r->forward(torch::zeros({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(ckpt::stateDict(*r).front().second.sizes(), (std::vector<int64_t>{64, 1, 3, 3}));
}

TEST(Models, SameSeedSameWeights) {
  torch::manual_seed(4);
  auto a = createModel(arch("resnet18", 10), {3, 32, 32});
  torch::manual_seed(4);
  auto b = createModel(arch("resnet18", 10), {3, 32, 32});
  auto sa = ckpt::stateDict(*a), sb = ckpt::stateDict(*b);
  for (size_t k = 0; k < sa.size(); ++k) EXPECT_TRUE(torch::equal(sa[k].second, sb[k].second));
}

TEST(Models, InputTooSmallIsAConfigError) {
  EXPECT_THROW(createModel(arch("resnet50", 10), {3, 16, 16}), ConfigError);
  EXPECT_THROW(createModel(arch("simple_cnn", 10), {1, 3, 3}), ConfigError);
}

TEST(Models, ZeroInitResidual) {
  ModelConfig c = arch("resnet18", 10);
  c.zeroInitResidual = true;
  auto m = createModel(c, {3, 32, 32});
  for (const auto& [name, t] : ckpt::stateDict(*m)) {
    if (name == "layer1.0.bn2.weight") {
      EXPECT_EQ(t.abs().sum().item<float>(), 0.0f);
    }
    if (name == "layer1.0.bn1.weight") {
      EXPECT_GT(t.abs().sum().item<float>(), 0.0f);
    }
  }
}

// model.memory_format changes the layout in memory, never the function: the
// same seed gives the same weights, outputs and gradients in either layout,
// and state dicts (checkpoints, final.pt) hold the same tensors.
TEST(Models, ChannelsLastComputesTheSameFunction) {
  ModelConfig c = arch("simple_cnn", 10);
  c.dropout = 0;
  c.memoryFormat = MemoryLayout::contiguous;
  torch::manual_seed(5);
  auto nchw = createModel(c, {1, 28, 28});
  c.memoryFormat = MemoryLayout::channelsLast;
  torch::manual_seed(5);
  auto nhwc = createModel(c, {1, 28, 28});
  EXPECT_FALSE(nchw->channelsLast());
  ASSERT_TRUE(nhwc->channelsLast());
  // One input channel: the weight must still get channels-last strides
  // (contiguous(ChannelsLast) alone would leave them), or kernels fall back.
  auto named = nhwc->named_parameters();
  EXPECT_EQ(named["conv1.weight"].stride(1), 1);
  EXPECT_TRUE(named["conv2.weight"].is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(named["conv2.weight"].is_contiguous());

  auto a = ckpt::stateDict(*nchw), b = ckpt::stateDict(*nhwc);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::equal(a[k].second, b[k].second)) << a[k].first;
  }
  // Saved from channels-last, loaded into NCHW (what torch.load users get).
  test::TempDir dir;
  ckpt::saveStateDict(b, dir.file("m.pt"));
  auto loaded = ckpt::readStateDict(dir.file("m.pt"));
  ASSERT_EQ(loaded.size(), a.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::equal(a[k].second, loaded[k].second)) << a[k].first;
  }
  at::Tensor x = torch::randn({4, 1, 28, 28});
  at::Tensor ya = nchw->forward(x), yb = nhwc->forward(x);
  EXPECT_TRUE(torch::allclose(ya, yb, 1e-4, 1e-5)) << (ya - yb).abs().max();
  ya.pow(2).sum().backward();
  yb.pow(2).sum().backward();
  auto pa = nchw->named_parameters(), pb = nhwc->named_parameters();
  for (const auto& item : pa) {
    const at::Tensor& ga = item.value().grad();
    const at::Tensor& gb = pb[item.key()].grad();
    EXPECT_TRUE(torch::allclose(ga, gb, 1e-3, 1e-5)) << item.key() << ": " << (ga - gb).abs().max();
  }
}

// The BatchNorms folded into the convolutions compute the same function
// in eval mode, for basic blocks and bottlenecks with their downsampling,
// the stem of both input sizes, and channels-last weights; and no
// normalization runs any more (its statistics no longer matter).
TEST(Models, ResNetFoldedForInferenceComputesTheSameFunction) {
  for (const char* name : {"resnet18", "resnet50"}) {
    for (const bool small : {false, true}) {
      ModelConfig c = arch(name, 10);
      c.smallInput = small;
      c.memoryFormat = small ? MemoryLayout::channelsLast : MemoryLayout::contiguous;
      torch::manual_seed(6);
      auto m = createModel(c, {3, 40, 40});
      {
        // Statistics and affine maps away from identity: a few training
        // forwards, then random scales and shifts.
        torch::NoGradGuard g;
        for (int k = 0; k < 3; ++k) m->forward(torch::randn({4, 3, 40, 40}) * 2 + 1);
        for (auto& item : m->named_parameters()) {
          if (item.key().find("bn") != std::string::npos || item.key().find("downsample.1") != std::string::npos) {
            item.value().uniform_(0.5, 1.5);
          }
        }
      }
      m->eval();
      torch::NoGradGuard g;
      const at::Tensor x = torch::randn({3, 3, 40, 40});
      const at::Tensor before = m->forward(x);
      m->foldForInference();
      m->foldForInference();  // a second call changes nothing
      const at::Tensor after = m->forward(x);
      const std::string what = std::string(name) + (small ? " small input" : "");
      EXPECT_TRUE(torch::allclose(after, before, 1e-4, 1e-4)) << what << ": " << (after - before).abs().max();
      for (auto& b : m->named_buffers()) {
        if (b.key().find("running_mean") != std::string::npos) b.value().fill_(1e6);
      }
      EXPECT_TRUE(torch::equal(m->forward(x), after)) << what << ": a BatchNorm still ran";
    }
  }
}

TEST(Models, AutoMemoryFormatIsChannelsLastOnlyWhereItIsFaster) {
  EXPECT_TRUE(createModel(arch("simple_cnn", 10), {1, 28, 28})->channelsLast());
  EXPECT_FALSE(createModel(arch("resnet18", 10), {3, 32, 32})->channelsLast());
  ModelConfig r = arch("resnet18", 10);
  r.memoryFormat = MemoryLayout::channelsLast;
  auto m = createModel(r, {3, 32, 32});
  EXPECT_TRUE(m->channelsLast());
  EXPECT_EQ(m->forward(torch::zeros({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 10}));
}

}  // namespace
}  // namespace cohort::models
