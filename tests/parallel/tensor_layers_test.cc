// Tensor parallelism's layers (parallel/tensor_layers.h) on T ranks, each a
// thread with its own process group: every slice's output and gradients
// equal the whole layer's, cut the same way, within float32 rounding.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <string>

#include "cohort/core/error.h"
#include "cohort/parallel/tensor_layers.h"
#include "util/rank_threads.h"

namespace cohort::parallel {
namespace {

constexpr double kTolerance = 1e-5;

// Within float32 rounding of a sum of a few hundred terms.
void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_LE(diff, kTolerance) << what << ": max difference " << diff;
}

// The whole MLP of a transformer block, as the GPT has it: c_fc, GELU,
// c_proj; its output, and the gradients of its weights and input.
struct WholeMlp {
  torch::nn::Linear fc{nullptr}, proj{nullptr};
  at::Tensor x, y, xGrad;
  WholeMlp(int64_t width, int64_t hidden) {
    torch::manual_seed(7);
    fc = torch::nn::Linear(width, hidden);
    proj = torch::nn::Linear(hidden, width);
    x = torch::randn({3, 5, width}).requires_grad_(true);
    y = proj(torch::gelu(fc(x)));
    y.pow(2).sum().backward();
    xGrad = x.grad().clone();
  }
};

class TensorLayers : public ::testing::TestWithParam<int> {};

TEST_P(TensorLayers, ColumnThenRowParallelMlpEqualsTheWholeMlp) {
  const int t = GetParam();
  const WholeMlp whole(12, 48);
  test::withRankThreads(t, "tp-mlp-" + std::to_string(t), [&](const comm::Comm& group) {
    const int r = group.rank;
    ColumnParallelLinear fc(sliceOf(whole.fc->weight.detach(), 0, t, r), sliceOf(whole.fc->bias.detach(), 0, t, r),
                            group);
    RowParallelLinear proj(sliceOf(whole.proj->weight.detach(), 1, t, r), whole.proj->bias.detach().clone(), group);
    const at::Tensor x = whole.x.detach().clone().requires_grad_(true);
    const at::Tensor y = proj(torch::gelu(fc(x)));
    y.pow(2).sum().backward();
    const std::string at = "rank " + std::to_string(r);
    expectClose(y.detach(), whole.y.detach(), at + ": output");
    expectClose(x.grad(), whole.xGrad, at + ": input gradient");
    expectClose(fc->weight.grad(), sliceOf(whole.fc->weight.grad(), 0, t, r), at + ": c_fc weight gradient");
    expectClose(fc->bias.grad(), sliceOf(whole.fc->bias.grad(), 0, t, r), at + ": c_fc bias gradient");
    expectClose(proj->weight.grad(), sliceOf(whole.proj->weight.grad(), 1, t, r), at + ": c_proj weight gradient");
    expectClose(proj->bias.grad(), whole.proj->bias.grad(), at + ": c_proj bias gradient");
    // No rank holds a whole weight.
    EXPECT_EQ(fc->weight.size(0), 48 / t);
    EXPECT_EQ(proj->weight.size(1), 48 / t);
  });
}

TEST_P(TensorLayers, VocabParallelEmbeddingAndCrossEntropyEqualTheWholeOnes) {
  const int t = GetParam();
  const int64_t vocab = 24, dim = 6, n = 10;
  torch::manual_seed(11);
  const at::Tensor table = torch::randn({vocab, dim}).requires_grad_(true);
  const at::Tensor tokens = torch::randint(0, vocab, {2, 5}, torch::kLong);
  // Every part of the vocabulary among the targets, its first and last rows too.
  at::Tensor target = torch::randint(0, vocab, {n}, torch::kLong);
  target[0] = 0;
  target[1] = vocab - 1;
  const at::Tensor hidden = torch::randn({n, dim});
  // Whole: the lookup, and the loss of logits = hidden . table^T (the tied head).
  const at::Tensor looked = torch::embedding(table, tokens);
  const at::Tensor loss = torch::nn::functional::cross_entropy(torch::matmul(hidden, table.t()), target);
  (looked.pow(2).sum() + loss).backward();
  test::withRankThreads(t, "tp-vocab-" + std::to_string(t), [&](const comm::Comm& group) {
    const int r = group.rank;
    const int64_t first = vocab / t * r;
    VocabParallelEmbedding wte(sliceOf(table.detach(), 0, t, r), first, group);
    const at::Tensor mine = wte(tokens);
    const at::Tensor logits = torch::matmul(hidden, wte->weight.t());
    EXPECT_EQ(logits.size(1), vocab / t) << "the logits are never whole";
    const at::Tensor l = vocabParallelCrossEntropy(logits, target, first, group);
    (mine.pow(2).sum() + l).backward();
    const std::string at = "rank " + std::to_string(r);
    expectClose(mine.detach(), looked.detach(), at + ": lookup");
    expectClose(l.detach(), loss.detach(), at + ": loss");
    expectClose(wte->weight.grad(), sliceOf(table.grad(), 0, t, r), at + ": table gradient");
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorLayers, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(TensorLayersCut, ASliceCountThatDoesNotDivideTheDimensionIsRefused) {
  const at::Tensor w = torch::zeros({10, 4});
  EXPECT_EQ(sliceOf(w, 0, 5, 4).sizes(), (std::vector<int64_t>{2, 4}));
  try {
    sliceOf(w, 0, 3, 0);
    FAIL() << "10 rows cut into 3 slices";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be cut into 3 equal slices along dimension 0"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace cohort::parallel
