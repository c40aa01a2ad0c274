// Model FLOPs (models/flops.h): the count from a model's shapes against
// hand counts and published figures, and against the matrix products and
// convolutions a real forward pass runs (counted by a RecordFunction
// observer, as a profiler counts them).

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cohort/models/flops.h"
#include "cohort/models/model.h"
#include "models/flash_attention.h"

namespace cohort::models {
namespace {

ModelConfig arch(const std::string& a) {
  ModelConfig c;
  c.arch = choiceFromName<ModelArch>(a).value();
  return c;
}

std::vector<int64_t> sizesOf(const c10::IValue& v) { return v.toTensor().sizes().vec(); }

// FLOPs (2 per multiply-add) of the matrix products and convolutions one
// forward pass of `model` on `input` runs, as the dispatcher sees them.
double observedForwardFlops(Model& model, const at::Tensor& input) {
  thread_local double flops = 0;
  flops = 0;
  auto count = [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
    const std::string name = fn.name();
    const auto in = fn.inputs();
    if (name == "aten::mm" || name == "aten::addmm") {
      const auto a = sizesOf(in[name == "aten::mm" ? 0 : 1]), b = sizesOf(in[name == "aten::mm" ? 1 : 2]);
      flops += 2.0 * double(a[0]) * double(a[1]) * double(b[1]);
    } else if (name == "aten::bmm" || name == "aten::baddbmm") {
      const auto a = sizesOf(in[name == "aten::bmm" ? 0 : 1]), b = sizesOf(in[name == "aten::bmm" ? 1 : 2]);
      flops += 2.0 * double(a[0]) * double(a[1]) * double(a[2]) * double(b[2]);
    } else if (name == "cohort::linear" || name == "cohort::gemm_conv") {
      // Linear layers through oneDNN (models/linear.h): x [m, in], W [out, in];
      // convolutions over their unfolded input (models/gemm_conv.h), every
      // tap: cols [pixels, taps], W [out, taps].
      const auto x = sizesOf(in[0]), w = sizesOf(in[1]);
      flops += 2.0 * double(x[0]) * double(x[1]) * double(w[0]);
    } else if (name == "aten::convolution") {
      // (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
      const auto x = sizesOf(in[0]), w = sizesOf(in[1]);
      const auto stride = in[3].toIntVector(), pad = in[4].toIntVector(), dil = in[5].toIntVector();
      double positions = 1;
      for (size_t d = 0; d < 2; ++d) {
        positions *= double((x[2 + d] + 2 * pad[d] - dil[d] * (w[2 + d] - 1) - 1) / stride[d] + 1);
      }
      flops += 2.0 * double(x[0]) * double(w[0]) * double(w[1]) * double(w[2] * w[3]) * positions;
    }
    return nullptr;
  };
  const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(count).needsInputs(true));
  {
    torch::NoGradGuard noGrad;
    model.eval();
    model.forward(input);
  }
  at::removeCallback(handle);
  return flops;
}

TEST(ModelFlops, TheGptExampleByHand) {
  // examples/gpt-kjv.yaml: 4 layers, 128 wide, a context of 256 bytes.
  ModelConfig c = arch("gpt");
  c.vocabSize = 256;
  const ModelFlops f = countModelFlops(c);
  ASSERT_TRUE(f.known);
  // Per token: 12 L C^2 = 786,432 weights in the blocks and C V = 32,768 in
  // the head, 2 FLOPs each; attention 4 L T C = 524,288.
  const double perToken = 2.0 * (786432 + 32768) + 524288;
  EXPECT_DOUBLE_EQ(f.forwardPerSample, 256 * perToken);
  EXPECT_DOUBLE_EQ(f.trainingPerSample, 3 * 256 * perToken);
  // 6N + 12 L C T per token, N the blocks' and the head's weights.
  EXPECT_DOUBLE_EQ(f.trainingPerSample / 256, 6.0 * (786432 + 32768) + 12.0 * 4 * 128 * 256);
}

TEST(ModelFlops, ResNetsAsTorchvisionPublishesThem) {
  // torchvision's model table: ResNet-18 1.81 and ResNet-50 4.09 "GFLOPS" at
  // 224 px, which are billions of multiply-adds.
  ModelConfig c = arch("resnet18");
  c.inChannels = 3;
  c.numClasses = 1000;
  EXPECT_NEAR(countModelFlops(c, 224, 224).forwardPerSample / 2e9, 1.81, 0.01);
  c.arch = ModelArch::resnet50;
  EXPECT_NEAR(countModelFlops(c, 224, 224).forwardPerSample / 2e9, 4.09, 0.01);
}

TEST(ModelFlops, LoraTrainsNoWeightGradientsOfTheBase) {
  ModelConfig c = arch("gpt");
  c.vocabSize = 256;
  c.lora.rank = 4;
  const ModelFlops f = countModelFlops(c);
  EXPECT_DOUBLE_EQ(f.trainingPerSample, 2 * f.forwardPerSample);
}

TEST(ModelFlops, TorchScriptIsNotCounted) {
  const ModelFlops f = countModelFlops(arch("torchscript"));
  EXPECT_FALSE(f.known);
  EXPECT_NE(f.why.find("TorchScript"), std::string::npos);
}

// Each architecture's count equals what its forward pass computes.
struct Case {
  std::string name;
  ModelConfig config;
  InputShape input;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  ModelConfig cnn = arch("simple_cnn");
  cnn.inChannels = 1;
  out.push_back({"simple_cnn", cnn, {1, 28, 28}});
  for (const char* r : {"resnet18", "resnet50"}) {
    ModelConfig c = arch(r);
    c.inChannels = 3;
    c.numClasses = 10;
    out.push_back({r, c, {3, 64, 64}});
    c.smallInput = true;
    out.push_back({std::string(r) + "_small_input", c, {3, 29, 31}});
  }
  ModelConfig gpt = arch("gpt");
  gpt.nLayer = 2;
  gpt.nHead = 2;
  gpt.nEmbd = 32;
  gpt.blockSize = 24;
  gpt.vocabSize = 67;
  out.push_back({"gpt", gpt, {}});
  ModelConfig llama = gpt;
  llama.arch = ModelArch::llama;
  llama.nHead = 4;
  llama.nKvHead = 2;
  out.push_back({"llama", llama, {}});
  ModelConfig bert = gpt;
  bert.arch = ModelArch::bert;
  out.push_back({"bert_masked_lm", bert, {}});
  bert.task = BertTask::classify;
  bert.numClasses = 3;
  out.push_back({"bert_classify", bert, {}});
  return out;
}

TEST(ModelFlops, EveryArchitectureCountsWhatItsForwardComputes) {
  // Attention through ATen's products, which the observer sees (the
  // blockwise kernel calls BLAS directly and skips the masked half).
  struct MatmulAttention {
    MatmulAttention() { setAttentionMatmulOnly(true); }
    ~MatmulAttention() { setAttentionMatmulOnly(false); }
  } matmulAttention;
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    const auto model = createModel(k.config, k.input);
    const bool tokens = decoderArch(k.config.arch) || k.config.arch == ModelArch::bert;
    const at::Tensor x = tokens ? torch::randint(0, k.config.vocabSize, {1, k.config.blockSize})
                                : torch::randn({1, k.input.channels, k.input.height, k.input.width});
    const ModelFlops f = countModelFlops(k.config, k.input.height, k.input.width);
    ASSERT_TRUE(f.known);
    const double seen = observedForwardFlops(*model, x);
    ASSERT_GT(seen, 0);
    EXPECT_NEAR(f.forwardPerSample / seen, 1.0, 1e-9) << f.formula;
  }
}

}  // namespace
}  // namespace cohort::models
