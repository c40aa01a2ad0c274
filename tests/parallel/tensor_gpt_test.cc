// The GPT split over T ranks (parallel/tensor_gpt.h), each rank a thread
// with its own process group and random generator: every rank's slices are
// the whole model's of the same seed, bitwise (with sequence parallelism
// too); the logits' slices, the loss,
// every parameter's gradient and the gradients' norm are the whole model's
// within float32 rounding; the exchanges are the expected count of bytes; the slices put back together on rank 0 are the
// whole model; splits that cannot work are refused naming the key.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <vector>
#include <string>

#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/parallel/tensor_gpt.h"
#include "parallel/detail/tensor_split.h"
#include "util/rank_threads.h"
#include "util/whole_decoder.h"

// A namespace of its own: the file shares a unity batch with others.
namespace cohort::parallel::tensor_gpt_test {
namespace {

constexpr double kTolerance = 1e-5;
constexpr uint64_t kSeed = 11;

models::GptOptions options() {
  models::GptOptions o;
  o.vocabSize = 64;
  o.blockSize = 8;
  o.nLayer = 2;
  o.nHead = 4;
  o.nEmbd = 16;
  return o;
}

// The whole model of kSeed, the loss of a batch and every gradient.
struct Whole : test::WholeDecoder {
  explicit Whole(const models::GptOptions& o)
      : WholeDecoder([&o] { return models::createGpt(o); }, o.vocabSize, o.blockSize, kSeed) {}
};

class TensorGpt : public ::testing::TestWithParam<int> {};

// With and without biases, with and without sequence parallelism (whose
// whole tensors' gradients are summed over the group after backward, as
// the plan sums them: detail::sumWholeGradients).
TEST_P(TensorGpt, SlicesAreTheWholeModelsBitwiseAndComputeItsLossAndGradients) {
  const int t = GetParam();
  for (const auto& flags : {std::pair{true, false}, std::pair{false, false}, std::pair{true, true},
                                       std::pair{false, true}}) {
    const bool bias = flags.first, sequence = flags.second;
    models::GptOptions o = options();
    o.bias = bias;
    const Whole whole(o);
    const std::string tag = std::to_string(t) + (bias ? "b" : "") + (sequence ? "s" : "");
    test::withRankThreads(t, "tp-gpt-" + tag, [&](const comm::Comm& group) {
      const int r = group.rank;
      const std::string at =
          "rank " + std::to_string(r) + (bias ? "" : " (no bias)") + (sequence ? " (sequence parallel)" : "");
      TensorSplitOptions split;
      split.sequenceParallel = sequence;
      auto model = createTensorParallelGpt(o, group, split, at::make_generator<at::CPUGeneratorImpl>(kSeed));
      // The same names as the whole model's, each this rank's slice, bitwise.
      const auto named = model->named_parameters();
      ASSERT_EQ(named.size(), whole.params.size()) << at;
      for (const auto& p : named) {
        ASSERT_EQ(whole.params.count(p.key()), 1u) << at << ": " << p.key();
        const at::Tensor want = sliceByCut(whole.params.at(p.key()), tensorCut(p.key()), t, r);
        EXPECT_TRUE(torch::equal(p.value().detach(), want)) << at << ": " << p.key();
      }
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
      // What forward and backward exchanged: per block one sum of the
      // activations [B, S, C] after attention and one after the MLP, and
      // their conjugates in backward (4 per block), one pair for the
      // embedding and the head, and the loss's 3 sums of B x S floats; with
      // sequence parallelism as many all-gathers of 1/T of the activations,
      // and one more in backward for each column-parallel layer (2 per
      // block), which kept only its part of the sequence.
      const TensorExchanges e = tensorExchanges();
      const int64_t pairs = 4 * o.nLayer + 2, activations = whole.tokens.numel() * o.nEmbd * 4;
      EXPECT_EQ(e.sums, t == 1 ? 0 : pairs + 3) << at;
      EXPECT_EQ(e.sumBytes, t == 1 ? 0 : pairs * activations + 3 * whole.tokens.numel() * 4) << at;
      const int64_t gathers = pairs + 2 * o.nLayer;
      EXPECT_EQ(e.gathers, t > 1 && sequence ? gathers : 0) << at;
      EXPECT_EQ(e.gatherBytes, t > 1 && sequence ? gathers * activations / t : 0) << at;
      whole.expectSplitGradients(*model, group, t, sequence, kTolerance, at);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorGpt, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// A tensor larger than a drawing piece (2^18 elements) and of a size 16
// does not divide: slices still the whole model's, bitwise.
TEST(TensorGptBuild, TensorsLargerThanAPieceAreDrawnExactly) {
  models::GptOptions o = options();
  o.nEmbd = 260;  // c_fc: [1040, 260], 270400 elements, two pieces
  o.nHead = 4;
  o.vocabSize = 1026;  // wte: [1026, 260], 266760 elements, two pieces, 266760 % 16 = 8
  o.nLayer = 1;
  o.blockSize = 9;  // wpe: [9, 260], 2340 elements, 2340 % 16 = 4
  torch::manual_seed(kSeed);
  auto whole = models::createGpt(o);
  std::map<std::string, at::Tensor> params;
  for (const auto& p : whole->named_parameters()) params[p.key()] = p.value().detach();
  test::withRankThreads(2, "tp-gpt-large", [&](const comm::Comm& group) {
    auto model = createTensorParallelGpt(o, group, {}, at::make_generator<at::CPUGeneratorImpl>(kSeed));
    for (const auto& p : model->named_parameters()) {
      const at::Tensor want = sliceByCut(params.at(p.key()), tensorCut(p.key()), 2, group.rank);
      EXPECT_TRUE(torch::equal(p.value().detach(), want)) << "rank " << group.rank << ": " << p.key();
    }
  });
}

// Sequence parallelism cuts the sequence in T: a length T does not divide
// is refused on every rank, before any exchange.
TEST(TensorGptBuild, ASequenceTheRanksCannotShareIsRefused) {
  const models::GptOptions o = options();
  test::withRankThreads(2, "tp-gpt-odd", [&](const comm::Comm& group) {
    TensorSplitOptions split;
    split.sequenceParallel = true;
    auto model = createTensorParallelGpt(o, group, split, at::make_generator<at::CPUGeneratorImpl>(kSeed));
    try {
      model->forward(torch::zeros({1, 7}, torch::kLong));
      ADD_FAILURE() << "a sequence of 7 on 2 ranks was taken";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("a sequence of 7 positions is not divisible by 2"), std::string::npos)
          << e.what();
    }
  });
}

TEST(TensorGptBuild, SplitsThatCannotWorkAreRefusedNamingTheKey) {
  auto refused = [](models::GptOptions o, int t) {
    try {
      checkGptTensorSplit(o, t);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refused(options(), 3).find("model.n_head (4) is not divisible by 3"), std::string::npos)
      << refused(options(), 3);
  models::GptOptions o = options();
  o.nHead = 8;
  o.nEmbd = 24;
  o.vocabSize = 60;
  EXPECT_NE(refused(o, 8).find("model.vocab_size (60) is not divisible by 8"), std::string::npos) << refused(o, 8);
  o = options();
  o.dropout = 0.1;
  EXPECT_NE(refused(o, 2).find("model.dropout"), std::string::npos);
  // Recomputed blocks run their exchanges again in backward: accepted
  // (tensor_job_test.cc trains with them).
  o = options();
  o.recompute = true;
  EXPECT_EQ(refused(o, 2), "");
  EXPECT_EQ(refused(options(), 2), "");
}

}  // namespace
}  // namespace cohort::parallel::tensor_gpt_test
