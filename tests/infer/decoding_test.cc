// Generation's pieces (infer/decoding.h) and the GPT's key/value cache
// (Model::decode): a cached step gives the logits of the whole sequence's
// forward, rows of several lengths decode together, the window moves past
// block_size the same way with the cache and without; top-k and top-p
// draw only from what they keep; stop strings are found and held back.

#include "cohort/infer/decoding.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "cohort/core/error.h"
#include "cohort/models/gpt.h"
#include "cohort/models/llama.h"
#include "util/errors.h"
#include "util/gpt.h"

namespace cohort::infer {
namespace {

std::shared_ptr<models::Model> tinyGpt(bool geluTanh = false) {
  torch::manual_seed(17);
  models::GptOptions o = test::gptSizes(50, 12, 2, 2, 16);
  o.geluTanh = geluTanh;
  auto m = models::createGpt(o);
  m->eval();
  return m;
}

// A llama of the same sizes with grouped-query attention: 4 query heads
// reading 2 key/value heads, of which the cache holds only the 2.
std::shared_ptr<models::Model> tinyLlama() {
  torch::manual_seed(17);
  models::LlamaOptions o;
  o.vocabSize = 50;
  o.blockSize = 12;
  o.nLayer = 2;
  o.nHead = 4;
  o.nKvHead = 2;
  o.nEmbd = 16;
  o.intermediate = 40;
  auto m = models::createLlama(o);
  m->eval();
  return m;
}

double maxDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(KvCache, EachCachedStepHasTheWholeSequencesLogits) {
  for (int kind : {0, 1, 2}) {
    SCOPED_TRACE(kind == 2 ? "llama" : "gpt");
    auto model = kind == 2 ? tinyLlama() : tinyGpt(kind == 1);
    torch::InferenceMode guard;
    const at::Tensor tokens = torch::randint(0, 50, {1, 12}, torch::kLong);
    const at::Tensor full = model->forward(tokens);  // [1, 12, 50]
    models::KvCache cache;
    // A prompt of 5 at once, then one token at a time.
    at::Tensor logits = model->decode({tokens[0].narrow(0, 0, 5)}, {&cache});
    EXPECT_LT(maxDiff(logits[0], full[0][4]), 1e-5);
    EXPECT_EQ(cache.length, 5);
    for (int64_t t = 5; t < 12; ++t) {
      logits = model->decode({tokens[0].narrow(0, t, 1)}, {&cache});
      EXPECT_LT(maxDiff(logits[0], full[0][t]), 1e-5) << "position " << t;
    }
    EXPECT_EQ(cache.length, 12);
    EXPECT_EQ(cache.pool->keys(0).size(1), 2) << "heads of keys held";
    // block_size is the end: the caller shifts the window instead.
    EXPECT_NE(test::errorOf<DataError>([&] { model->decode({tokens[0].narrow(0, 0, 1)}, {&cache}); })
                  .find("pass model.block_size (12)"),
              std::string::npos);
  }
}

TEST(KvCache, RowsOfDifferentLengthsDecodeTogetherAsEachAlone) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    auto model = llama ? tinyLlama() : tinyGpt();
    torch::InferenceMode guard;
    // Cached lengths 1, 7, 4 and 0; then rows of 1, 1, 3 and 5 new tokens in
    // one call: single tokens beside a prompt.
    const std::vector<int64_t> cached = {1, 7, 4, 0}, fresh = {1, 1, 3, 5};
    std::vector<models::KvCache> alone(4), together(4);
    std::vector<at::Tensor> prompts, rows;
    std::vector<models::KvCache*> caches;
    for (size_t r = 0; r < 4; ++r) {
      prompts.push_back(torch::randint(0, 50, {cached[r]}, torch::kLong));
      if (cached[r] > 0) {
        model->decode({prompts[r]}, {&alone[r]});
        model->decode({prompts[r]}, {&together[r]});
      }
      rows.push_back(torch::randint(0, 50, {fresh[r]}, torch::kLong));
      caches.push_back(&together[r]);
    }
    const at::Tensor batched = model->decode(rows, caches);
    ASSERT_EQ(batched.sizes(), (std::vector<int64_t>{4, 50}));
    for (size_t r = 0; r < 4; ++r) {
      const at::Tensor one = model->decode({rows[r]}, {&alone[r]});
      EXPECT_LT(maxDiff(batched[static_cast<int64_t>(r)], one[0]), 1e-5) << "row " << r;
      // And both are the forward of the whole sequence.
      const at::Tensor whole = torch::cat({prompts[r], rows[r]}).unsqueeze(0);
      EXPECT_LT(maxDiff(one[0], model->forward(whole)[0][cached[r] + fresh[r] - 1]), 1e-5);
      EXPECT_EQ(together[r].length, cached[r] + fresh[r]);
    }
    // The next step of all four together still agrees.
    std::vector<at::Tensor> next;
    for (size_t r = 0; r < 4; ++r) next.push_back(torch::randint(0, 50, {1}, torch::kLong));
    const at::Tensor step = model->decode(next, caches);
    for (size_t r = 0; r < 4; ++r) {
      EXPECT_LT(maxDiff(step[static_cast<int64_t>(r)], model->decode({next[r]}, {&alone[r]})[0]), 1e-5) << r;
    }
  }
}

TEST(Generation, TheCacheAndTheWholeWindowGiveTheSameTokensPastBlockSize) {
  auto model = tinyGpt();
  torch::InferenceMode guard;
  Sampling s;
  s.temperature = 0.8;
  s.seed = 3;
  auto generate = [&](bool cached) {
    Sequence seq({1, 2, 3}, 12, cached);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(s.seed);
    std::vector<at::Tensor> logits;
    for (int i = 0; i < 40; ++i) {  // past block_size 12 several times
      logits.push_back(nextLogits(*model, seq));
      seq.append(sampleNext(logits.back(), s, gen));
    }
    return std::make_pair(seq.tokens(), logits);
  };
  const auto [cachedTokens, cachedLogits] = generate(true);
  const auto [plainTokens, plainLogits] = generate(false);
  EXPECT_EQ(cachedTokens, plainTokens);
  for (size_t i = 0; i < cachedLogits.size(); ++i) EXPECT_LT(maxDiff(cachedLogits[i], plainLogits[i]), 1e-4) << i;
}

TEST(Generation, TheWindowIsTheNewestBlockAndThenItsNewestHalf) {
  Sequence seq({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 8, /*cached=*/true);
  EXPECT_EQ(seq.input(), (std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9}));  // a long prompt: its last block
  seq.cache().length = 8;                                                    // as decode() leaves it
  seq.append(10);
  EXPECT_EQ(seq.input(), (std::vector<int64_t>{7, 8, 9, 10}));  // past the block: the newest half, again
  EXPECT_EQ(seq.cache().length, 0);
  seq.cache().length = 4;
  seq.append(11);
  EXPECT_EQ(seq.input(), (std::vector<int64_t>{11}));  // then one token at a time
  Sequence plain({0, 1, 2}, 8, /*cached=*/false);
  EXPECT_EQ(plain.input(), (std::vector<int64_t>{0, 1, 2}));
  plain.append(3);
  EXPECT_EQ(plain.input(), (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(Sampling, TopKAndTopPDrawOnlyWhatTheyKeep) {
  // Probabilities 0.5, 0.25, 0.15, 0.1.
  const at::Tensor logits = torch::log(torch::tensor({0.5f, 0.25f, 0.15f, 0.1f}));
  auto drawn = [&](Sampling s) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
    std::set<int64_t> seen;
    for (int i = 0; i < 400; ++i) seen.insert(sampleNext(logits, s, gen));
    return seen;
  };
  EXPECT_EQ(drawn({}), (std::set<int64_t>{0, 1, 2, 3}));
  Sampling k;
  k.topK = 2;
  EXPECT_EQ(drawn(k), (std::set<int64_t>{0, 1}));
  Sampling p;
  p.topP = 0.7;  // 0.5 + 0.25 reach it
  EXPECT_EQ(drawn(p), (std::set<int64_t>{0, 1}));
  p.topP = 0.8;  // 0.5 + 0.25 fall short: the third too
  EXPECT_EQ(drawn(p), (std::set<int64_t>{0, 1, 2}));
  p.topP = 0.01;
  EXPECT_EQ(drawn(p), (std::set<int64_t>{0}));
  Sampling greedy;
  greedy.temperature = 0;
  EXPECT_EQ(drawn(greedy), (std::set<int64_t>{0}));
  Sampling bad;
  bad.topP = 0;
  EXPECT_NE(test::errorOf<UsageError>([&] { checkSampling(bad, "--"); }).find("--top-p: must be in (0, 1]"),
            std::string::npos);
}

TEST(StopStrings, TheFirstIsFoundAndABeginningIsHeldBack) {
  const std::vector<std::string> stops = {"\n\n", "END"};
  EXPECT_EQ(findStop("abc\n\nxEND", stops), 3u);
  EXPECT_EQ(findStop("abcEN", stops), std::string::npos);
  EXPECT_EQ(stopPrefix("abcEN", stops), 2u);
  EXPECT_EQ(stopPrefix("abc\n", stops), 1u);
  EXPECT_EQ(stopPrefix("abc", stops), 0u);
  EXPECT_EQ(stopPrefix("E", {"END", ""}), 1u);
  EXPECT_EQ(findStop("abc", {}), std::string::npos);
}

}  // namespace
}  // namespace cohort::infer
