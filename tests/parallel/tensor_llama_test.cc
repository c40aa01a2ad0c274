// The Llama decoder split over T ranks (parallel/tensor_llama.h), each rank
// a thread with its own process group and random generator, with fewer
// key/value heads than query heads: every rank's slices are the whole
// model's of the same seed, bitwise (tied head or not, with sequence
// parallelism too); the logits' slices, the loss, every parameter's
// gradient and the gradients' norm are the whole model's within float32
// rounding; the exchanges are the expected count of bytes; the slices put
// back together on rank 0 are the whole model; a pipeline stage's slices
// are the whole model's; splits that cannot work are refused naming the key.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "cohort/core/error.h"
#include "cohort/models/llama.h"
#include "cohort/parallel/tensor_layers.h"
#include "cohort/parallel/tensor_llama.h"
#include "parallel/detail/tensor_split.h"
#include "util/rank_threads.h"
#include "util/whole_decoder.h"

// A namespace of its own: the file shares a unity batch with others.
namespace cohort::parallel::tensor_llama_test {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 13;

// 8 query heads reading 4 key/value heads (2 each), heads of 4: T = 4
// leaves each rank 2 query heads and the 1 key/value head they read.
models::LlamaOptions options() {
  models::LlamaOptions o;
  o.vocabSize = 64;
  o.blockSize = 8;
  o.nLayer = 2;
  o.nHead = 8;
  o.nKvHead = 4;
  o.nEmbd = 32;
  o.intermediate = 48;
  return o;
}

// The whole model of kSeed, the loss of a batch and every gradient.
struct Whole : test::WholeDecoder {
  explicit Whole(const models::LlamaOptions& o)
      : WholeDecoder([&o] { return models::createLlama(o); }, o.vocabSize, o.blockSize, kSeed) {}
};

class TensorLlama : public ::testing::TestWithParam<int> {};

TEST_P(TensorLlama, SlicesAreTheWholeModelsBitwiseAndComputeItsLossAndGradients) {
  const int t = GetParam();
  for (const auto& flags : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true},
                                       std::pair{true, true}}) {
    const bool tied = flags.first, sequence = flags.second;
    models::LlamaOptions o = options();
    o.tiedHead = tied;
    const Whole whole(o);
    const std::string tag = std::to_string(t) + (tied ? "t" : "") + (sequence ? "s" : "");
    test::withRankThreads(t, "tp-llama-" + tag, [&](const comm::Comm& group) {
      const int r = group.rank;
      const std::string at =
          "rank " + std::to_string(r) + (tied ? " (tied head)" : "") + (sequence ? " (sequence parallel)" : "");
      TensorSplitOptions split;
      split.sequenceParallel = sequence;
      auto model = createTensorParallelLlama(o, group, split, at::make_generator<at::CPUGeneratorImpl>(kSeed));
      const auto named = model->named_parameters();
      ASSERT_EQ(named.size(), whole.params.size()) << at;
      for (const auto& p : named) {
        ASSERT_EQ(whole.params.count(p.key()), 1u) << at << ": " << p.key();
        const at::Tensor want = sliceByCut(whole.params.at(p.key()), tensorCut(p.key()), t, r);
        EXPECT_TRUE(torch::equal(p.value().detach(), want)) << at << ": " << p.key();
      }
      // The key/value projections are cut by their own heads: 1/T of n_kv_head's rows.
      EXPECT_EQ(tensorCut("model.layers.1.self_attn.k_proj.weight").dim, 0);
      EXPECT_EQ(tensorCut("model.layers.1.self_attn.o_proj.weight").dim, 1);
      EXPECT_FALSE(tensorCut("model.layers.1.input_layernorm.weight").split());
      tensorExchanges() = {};
      const at::Tensor logits = model->forward(whole.tokens);
      const int64_t width = o.vocabSize / t;
      ASSERT_EQ(logits.size(2), width) << at;
      EXPECT_EQ(model->vocabFirst(), r * width);
      EXPECT_LE((logits.detach() - whole.logits.narrow(2, r * width, width)).abs().max().item<double>(), kTolerance)
          << at << ": logits";
      const at::Tensor loss = model->loss(logits, whole.targets);
      EXPECT_NEAR(loss.item<double>(), whole.loss, kTolerance) << at;
      loss.backward();
      // Per block one sum after attention and one after the MLP and their
      // conjugates in backward (the three projections share one input, as
      // gate and up do), one pair for the embedding and the head, the
      // loss's 3 sums of B x S floats; with sequence parallelism each pair
      // also gathers 1/T of the activations once each way.
      const TensorExchanges e = tensorExchanges();
      const int64_t pairs = 4 * o.nLayer + 2, activations = whole.tokens.numel() * o.nEmbd * 4;
      EXPECT_EQ(e.sums, t == 1 ? 0 : pairs + 3) << at;
      EXPECT_EQ(e.sumBytes, t == 1 ? 0 : pairs * activations + 3 * whole.tokens.numel() * 4) << at;
      EXPECT_EQ(e.gathers, t > 1 && sequence ? pairs : 0) << at;
      EXPECT_EQ(e.gatherBytes, t > 1 && sequence ? pairs * activations / t : 0) << at;
      whole.expectSplitGradients(*model, group, t, sequence, kTolerance, at);
      // What a checkpoint records: every split tensor once, q/k/v each one block.
      const auto cuts = model->wholeCuts();
      EXPECT_EQ(cuts.size(), 7 * o.nLayer + (tied ? 1 : 2)) << at;
      for (const auto& [name, cut] : cuts) EXPECT_EQ(cut.blocks, 1) << name;
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorLlama, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// A pipeline stage's slices (the last stage: its blocks, the norm and the
// untied head) are the whole model's, every number of the first stage
// drawn and dropped; it takes the residual stream, not tokens.
TEST(TensorLlamaBuild, AStagesSlicesAreTheWholeModels) {
  const models::LlamaOptions o = options();
  torch::manual_seed(kSeed);
  auto whole = models::createLlama(o);
  std::map<std::string, at::Tensor> params;
  for (const auto& p : whole->named_parameters()) params[p.key()] = p.value().detach();
  test::withRankThreads(2, "tp-llama-stage", [&](const comm::Comm& group) {
    models::ModelPart last;
    last.firstBlock = 1;
    last.input = false;
    auto model = createTensorParallelLlama(o, group, {}, at::make_generator<at::CPUGeneratorImpl>(kSeed), last);
    std::vector<std::string> names;
    for (const auto& p : model->named_parameters()) {
      names.push_back(p.key());
      const at::Tensor want = sliceByCut(params.at(p.key()), tensorCut(p.key()), 2, group.rank);
      EXPECT_TRUE(torch::equal(p.value().detach(), want)) << "rank " << group.rank << ": " << p.key();
    }
    EXPECT_EQ(names.front(), "model.layers.1.self_attn.q_proj.weight");
    EXPECT_EQ(names.back(), "lm_head.weight");
    EXPECT_EQ(model->shardingUnits(), std::vector<std::string>{"model.layers.1"});
    try {
      model->forward(torch::zeros({1, 4}, torch::kLong));
      ADD_FAILURE() << "a later stage took tokens";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("llama: expected activations [batch, time, 32]"), std::string::npos)
          << e.what();
    }
  });
}

TEST(TensorLlamaBuild, SplitsThatCannotWorkAreRefusedNamingTheKey) {
  auto refused = [](models::LlamaOptions o, int t) {
    try {
      checkLlamaTensorSplit(o, t);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  models::LlamaOptions o = options();
  o.nKvHead = 2;
  EXPECT_NE(refused(o, 4).find("distribution.tensor: 4 ranks cannot split the model: model.n_kv_head (2) is not "
                               "divisible by 4"),
            std::string::npos)
      << refused(o, 4);
  EXPECT_EQ(refused(o, 2), "");
  o = options();
  o.intermediate = 50;
  EXPECT_NE(refused(o, 4).find("model.intermediate_size (50) is not divisible by 4"), std::string::npos)
      << refused(o, 4);
  o = options();
  o.vocabSize = 66;
  EXPECT_NE(refused(o, 4).find("model.vocab_size (66) is not divisible by 4"), std::string::npos) << refused(o, 4);
  o = options();
  o.dropout = 0.1;
  EXPECT_NE(refused(o, 2).find("model.dropout"), std::string::npos);
  EXPECT_EQ(refused(options(), 4), "");
}

}  // namespace
}  // namespace cohort::parallel::tensor_llama_test
