// The paged key/value cache (models/kv_cache.h): a sequence holds the
// blocks its positions fill and no more, clearing or dropping a cache gives
// them back, freed blocks are reused, and decoding with caches that share
// one pool (blocks of several rows interleaved, reused after others left)
// gives the logits of each row decoded alone with a private pool, and of
// the forward of the whole sequence.

#include "cohort/models/kv_cache.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "cohort/models/gpt.h"
#include "cohort/models/llama.h"
#include "util/gpt.h"

namespace cohort::models {
namespace {

std::shared_ptr<Model> pagedGpt() {
  torch::manual_seed(5);
  auto m = createGpt(test::gptSizes(50, 40, 2, 2, 16));
  m->eval();
  return m;
}

std::shared_ptr<Model> pagedLlama() {
  torch::manual_seed(5);
  LlamaOptions o;
  o.vocabSize = 50;
  o.blockSize = 40;
  o.nLayer = 2;
  o.nHead = 4;
  o.nKvHead = 2;
  o.nEmbd = 16;
  o.intermediate = 40;
  auto m = createLlama(o);
  m->eval();
  return m;
}

double pagedDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(KvPool, BlocksFollowTheTokensHeldAndComeBack) {
  auto model = pagedGpt();
  torch::InferenceMode guard;
  auto pool = std::make_shared<KvPool>(16);
  {
    KvCache cache(pool);
    model->decode({torch::randint(0, 50, {20}, torch::kLong)}, {&cache});
    EXPECT_EQ(cache.length, 20);
    EXPECT_EQ(cache.blocks.size(), 2u) << "20 positions in blocks of 16";
    EXPECT_EQ(pool->blocksInUse(), 2);
    for (int i = 0; i < 12; ++i) model->decode({torch::randint(0, 50, {1}, torch::kLong)}, {&cache});
    EXPECT_EQ(cache.length, 32);
    EXPECT_EQ(pool->blocksInUse(), 2) << "32 positions still fit in 2 blocks";
    model->decode({torch::randint(0, 50, {1}, torch::kLong)}, {&cache});
    EXPECT_EQ(pool->blocksInUse(), 3);
    // Keys and values of 2 layers, 2 heads of 8 per position, float: 2 * 2 * 16 * 2 * 8 * 4 bytes a block.
    EXPECT_EQ(pool->bytesPerBlock(), 2 * 2 * 16 * 2 * 8 * 4);
    KvCache other(pool);
    model->decode({torch::randint(0, 50, {3}, torch::kLong)}, {&other});
    EXPECT_EQ(pool->blocksInUse(), 4);
    other.clear();
    EXPECT_EQ(pool->blocksInUse(), 3);
    EXPECT_EQ(other.length, 0);
    EXPECT_EQ(pool->blocksTotal(), 4);
    EXPECT_GE(pool->blocksReserved(), 4) << "the storage has room for every block handed out";
    EXPECT_LE(pool->blocksReserved(), 5) << "and at most a quarter more";
  }
  EXPECT_EQ(pool->blocksInUse(), 0) << "a dropped cache gives its blocks back";
  KvCache again(pool);
  model->decode({torch::randint(0, 50, {40}, torch::kLong)}, {&again});
  EXPECT_EQ(pool->blocksInUse(), 3);
  EXPECT_EQ(pool->blocksTotal(), 4) << "freed blocks are reused before new ones";
  // A moved cache carries its blocks; the moved-from one holds none.
  KvCache moved(std::move(again));
  EXPECT_EQ(moved.blocks.size(), 3u);
  EXPECT_TRUE(again.blocks.empty());  // NOLINT(bugprone-use-after-move): defined state
  moved.clear();
  EXPECT_EQ(pool->blocksInUse(), 0);
}

TEST(KvPool, RowsSharingAPoolDecodeAsEachAloneAndAsTheForward) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt");
    auto model = llama ? pagedLlama() : pagedGpt();
    torch::InferenceMode guard;
    // Blocks of 4 positions, so that rows hold many, interleaved in the
    // pool as they grow together.
    auto pool = std::make_shared<KvPool>(4);
    const std::vector<int64_t> prompt = {1, 9, 4, 13, 6, 2, 17, 3};
    std::vector<std::vector<int64_t>> tokens;
    std::vector<KvCache> shared, alone;
    for (int64_t len : prompt) {
      tokens.push_back({});
      for (int64_t i = 0; i < 30; ++i) tokens.back().push_back((len * 7 + i * 3) % 50);
      shared.emplace_back(pool);
      alone.emplace_back();
    }
    auto run = [&](size_t r, int64_t from, int64_t n) {
      return torch::tensor(std::vector<int64_t>(tokens[r].begin() + from, tokens[r].begin() + from + n),
                           torch::kLong);
    };
    // Step 0: every prompt together; then one token per row per step, with
    // row 3 dropped after step 5 and a new sequence taking its blocks.
    std::vector<int64_t> held(prompt.size(), 0);
    for (int step = 0; step < 12; ++step) {
      std::vector<at::Tensor> rows;
      std::vector<KvCache*> caches;
      std::vector<size_t> which;
      for (size_t r = 0; r < prompt.size(); ++r) {
        if (r == 3 && step > 5 && step < 8) continue;  // gone, and back as a new sequence at step 8
        if (r == 3 && step == 8) {
          shared[r].clear();
          alone[r].clear();
          held[r] = 0;
        }
        const int64_t n = held[r] == 0 ? prompt[r] : 1;
        rows.push_back(run(r, held[r], n));
        caches.push_back(&shared[r]);
        which.push_back(r);
      }
      const at::Tensor together = model->decode(rows, caches);
      for (size_t i = 0; i < which.size(); ++i) {
        const size_t r = which[i];
        const at::Tensor one = model->decode({rows[i]}, {&alone[r]});
        const int64_t end = held[r] + rows[i].size(0);
        EXPECT_LT(pagedDiff(together[static_cast<int64_t>(i)], one[0]), 1e-5) << "row " << r << " step " << step;
        const at::Tensor whole = run(r, 0, end).unsqueeze(0);
        EXPECT_LT(pagedDiff(one[0], model->forward(whole)[0][end - 1]), 1e-5) << "row " << r << " step " << step;
        held[r] = end;
        EXPECT_EQ(shared[r].length, end);
        EXPECT_EQ(static_cast<int64_t>(shared[r].blocks.size()), (end + 3) / 4);
      }
    }
    int64_t blocks = 0;
    for (const KvCache& c : shared) blocks += static_cast<int64_t>(c.blocks.size());
    EXPECT_EQ(pool->blocksInUse(), blocks);
    shared.clear();
    EXPECT_EQ(pool->blocksInUse(), 0);
  }
}

TEST(KvPool, ABlockOfTheWholeContextDecodesTheSame) {
  // One block per sequence of block_size positions: the memory of a cache
  // made whole up front (what cohort held before the pages), the same logits.
  auto model = pagedGpt();
  torch::InferenceMode guard;
  const at::Tensor tokens = torch::randint(0, 50, {1, 40}, torch::kLong);
  const at::Tensor full = model->forward(tokens);
  auto pool = std::make_shared<KvPool>(40);
  KvCache cache(pool);
  model->decode({tokens[0].narrow(0, 0, 10)}, {&cache});
  for (int64_t t = 10; t < 40; ++t) {
    const at::Tensor logits = model->decode({tokens[0].narrow(0, t, 1)}, {&cache});
    EXPECT_LT(pagedDiff(logits[0], full[0][t]), 1e-5) << t;
  }
  EXPECT_EQ(pool->blocksInUse(), 1);
}

}  // namespace
}  // namespace cohort::models
