// The parts of elastic training that need no process: a round's layout and batch,
// the --rdzv URL, and the held state a node keeps in memory.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "cohort/ckpt/held_state.h"
#include "cohort/ckpt/rank_state.h"
#include "cohort/config/job.h"
#include "cohort/core/error.h"
#include "cohort/elastic/agent.h"
#include "cohort/elastic/round_policy.h"
#include "util/process.h"

namespace cohort::elastic {
namespace {

JobConfig nominal(BatchPolicy p) {
  JobConfig j;
  j.distribution.nodes = 2;
  j.distribution.procsPerNode = 2;
  j.training.batchSize = 8;
  j.training.accumulateSteps = 3;
  j.training.optimizer.lr = 0.1;
  j.elastic.batchPolicy = p;
  return j;  // global batch 8 x 3 x 4 = 96
}

TEST(BatchPolicy, KeepGlobalAdjustsAccumulation) {
  JobConfig j = nominal(BatchPolicy::keepGlobal);
  applyRoundPolicy(j, 12);
  EXPECT_EQ(j.training.accumulateSteps, 1);
  j = nominal(BatchPolicy::keepGlobal);
  applyRoundPolicy(j, 2);
  EXPECT_EQ(j.training.accumulateSteps, 6);
  j = nominal(BatchPolicy::keepGlobal);
  try {
    applyRoundPolicy(j, 8);  // 96 / (8 x 8) is not whole
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("8 ranks"), std::string::npos) << e.what();
  }
  // The agent checks every size up front: 1..3 nodes of 2 ranks (2, 4, 6).
  EXPECT_NO_THROW(checkRoundPolicy(nominal(BatchPolicy::keepGlobal), 1, 3));
  EXPECT_THROW(checkRoundPolicy(nominal(BatchPolicy::keepGlobal), 1, 4), ConfigError);
}

TEST(BatchPolicy, KeepPerRankScalesTheLearningRateLinearly) {
  JobConfig j = nominal(BatchPolicy::keepPerRank);
  applyRoundPolicy(j, 6);
  EXPECT_EQ(j.training.accumulateSteps, 3);
  EXPECT_EQ(j.training.optimizer.baseBatch, 96);  // lr 0.1 at 96; 0.15 at 144
  j = nominal(BatchPolicy::keepPerRank);
  j.training.optimizer.baseBatch = 256;  // the job's own rule stays
  applyRoundPolicy(j, 6);
  EXPECT_EQ(j.training.optimizer.baseBatch, 256);
}

// A job of 2 nodes x 4 ranks, 4 pipeline stages of GPT's 8 blocks.
JobConfig pipelined(ReformAxis gives, int64_t tensor = 1) {
  JobConfig j = nominal(BatchPolicy::keepPerRank);
  j.distribution.procsPerNode = 4;
  j.distribution.pipeline.stages = 4 / tensor;
  j.distribution.pipeline.split.blocks = {2, 2, 2, 2};
  j.distribution.tensor = tensor;
  j.model.arch = ModelArch::gpt;
  j.model.nLayer = 8;
  j.elastic.gives = gives;
  return j;
}

TEST(RoundLayout, ReplicasGiveFirstAndTheStagesWhenTheWorldCannotKeepThem) {
  const JobConfig j = pipelined(ReformAxis::replicas);
  auto shape = [&](const JobConfig& job, int64_t world) {
    const RoundLayout l = roundLayout(job, world);
    return std::vector<int64_t>{l.replicas, l.stages, l.tensor};
  };
  EXPECT_EQ(shape(j, 8), (std::vector<int64_t>{2, 4, 1}));
  EXPECT_EQ(shape(j, 4), (std::vector<int64_t>{1, 4, 1}));
  EXPECT_EQ(shape(j, 12), (std::vector<int64_t>{3, 4, 1}));
  EXPECT_EQ(shape(j, 6), (std::vector<int64_t>{2, 3, 1}));  // 6 is no multiple of 4 stages
  EXPECT_EQ(shape(j, 2), (std::vector<int64_t>{1, 2, 1}));
  // stages: the nominal 2 replicas stay while the stages can follow.
  const JobConfig s = pipelined(ReformAxis::stages);
  EXPECT_EQ(shape(s, 4), (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(shape(s, 12), (std::vector<int64_t>{2, 6, 1}));
  EXPECT_EQ(shape(s, 20), (std::vector<int64_t>{5, 4, 1}));  // 10 stages > 8 blocks: as replicas
  // The tensor split stays; a world it does not divide is refused, naming it.
  const JobConfig t = pipelined(ReformAxis::replicas, 2);
  EXPECT_EQ(shape(t, 4), (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(shape(t, 2), (std::vector<int64_t>{1, 1, 2}));
  try {
    (void)roundLayout(t, 3);
    FAIL() << "3 ranks taken for a tensor split of 2";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("distribution.tensor: 2 tensor ranks do not divide a round of 3"),
              std::string::npos)
        << e.what();
  }
  // The agent checks every size up front: 1..2 nodes of 3 ranks.
  JobConfig odd = t;
  odd.distribution.procsPerNode = 3;
  EXPECT_THROW(checkRoundPolicy(odd, 1, 2), ConfigError);
}

TEST(RoundLayout, ARoundWithOtherStagesTakesAnAutoSplitAndKeepsTheGlobalBatch) {
  JobConfig j = pipelined(ReformAxis::replicas);
  j.elastic.batchPolicy = BatchPolicy::keepGlobal;
  j.distribution.pipeline.microBatches = 4;  // global: 8 x 3 x 4 x 2 replicas = 192
  JobConfig r = j;
  applyRoundPolicy(r, 6);  // 2 replicas x 3 stages
  EXPECT_EQ(r.distribution.pipeline.stages, 3);
  EXPECT_TRUE(r.distribution.pipeline.split.automatic());
  EXPECT_EQ(r.training.accumulateSteps, 3);  // 8 x 4 x 3 x 2 = 192
  r = j;
  applyRoundPolicy(r, 4);  // 1 replica x 4 stages
  EXPECT_EQ(r.distribution.pipeline.split.blocks, (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(r.training.accumulateSteps, 6);
  r = j;
  applyRoundPolicy(r, 1);  // no pipeline left: 192 / 8 micro-batches of one rank
  EXPECT_EQ(r.distribution.pipeline.stages, 1);
  EXPECT_EQ(r.training.accumulateSteps, 24);
  // keep_per_rank: a replica's step keeps its 8 micro-batches of 4 stages
  // (the default 4 x stages), as accumulation without a pipeline.
  r = pipelined(ReformAxis::stages);
  applyRoundPolicy(r, 4);  // 2 replicas x 2 stages
  EXPECT_EQ(r.distribution.pipeline.microBatchCount(), 16);
  r = pipelined(ReformAxis::stages);
  applyRoundPolicy(r, 2);  // 2 replicas, no pipeline
  EXPECT_EQ(r.distribution.pipeline.stages, 1);
  EXPECT_EQ(r.training.accumulateSteps, 3 * 16);
}

TEST(RdzvUrl, SplitsTheJobIdAndRefusesBadOnes) {
  EXPECT_EQ(splitRdzvUrl("etcd://a:1,b:2/job-1").first, "etcd://a:1,b:2");
  EXPECT_EQ(splitRdzvUrl("etcd://a:1,b:2/job-1").second, "job-1");
  EXPECT_EQ(splitRdzvUrl("store://10.0.0.1:29400/x.y_z").second, "x.y_z");
  EXPECT_THROW(splitRdzvUrl("store://10.0.0.1:29400"), ConfigError);
  EXPECT_THROW(splitRdzvUrl("store://10.0.0.1:29400/"), ConfigError);
  EXPECT_THROW(splitRdzvUrl("store://h:1/a/b"), ConfigError);
  EXPECT_THROW(splitRdzvUrl("h:1/job"), ConfigError);
}

TEST(HeldState, PartsOfSeveralRanksMakeOneStep) {
  test::TempDir dir;
  ckpt::Manifest m;
  m.step = 12;
  m.epoch = 1;
  m.worldSize = 2;
  const at::Tensor w = torch::arange(6, torch::kFloat32);
  auto file = [&](const std::string& name, const at::Tensor& t) {
    return ckpt::SnapshotFile(name, std::vector<ckpt::SnapshotItem>{{"w", t}});
  };
  ckpt::writeHeldState(dir.path(), m, {file("model.bin", w), file("optimizer.bin", w * 2),
                                       file(ckpt::rankStateFile(0), w)},
                       0);
  ckpt::writeHeldState(dir.path(), m, {file(ckpt::rankStateFile(1), w)}, 1);
  auto held = ckpt::listHeldState(dir.path());
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].manifest.step, 12);
  EXPECT_EQ(held[0].manifest.files.size(), 4u);
  EXPECT_TRUE(ckpt::missingFiles(held[0].manifest).empty());
  // A torn file (another size than its part says) is not held.
  std::filesystem::resize_file(held[0].path + "/optimizer.bin", 10);
  held = ckpt::listHeldState(dir.path());
  EXPECT_EQ(held[0].manifest.files.size(), 3u);
  EXPECT_EQ(ckpt::missingFiles(held[0].manifest), std::vector<std::string>{"optimizer.bin"});
  // Older steps go once a newer one is written.
  m.step = 20;
  ckpt::writeHeldState(dir.path(), m, {file("model.bin", w)}, 0);
  ckpt::pruneHeldState(dir.path(), 20);
  held = ckpt::listHeldState(dir.path());
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].manifest.step, 20);
  // A pipeline's and a tensor split's files: each stage's slices, and with
  // ZeRO each data rank's parts of its stage.
  m.extra["pipeline"] = {{"stages", 2}, {"stage_zero", {nullptr, {{"world_size", 2}}}}};
  m.extra["tensor"] = {{"tensors", 2}};
  EXPECT_EQ(ckpt::requiredFiles(m),
            (std::vector<std::string>{"slice0-stage0-model.bin", "slice0-stage0-optimizer.bin", "slice0-stage1-model.bin",
                                      "slice0-stage1-optimizer-0.bin", "slice0-stage1-optimizer-1.bin",
                                      "slice1-stage0-model.bin", "slice1-stage0-optimizer.bin", "slice1-stage1-model.bin",
                                      "slice1-stage1-optimizer-0.bin", "slice1-stage1-optimizer-1.bin"}));
  m.extra.erase("pipeline");
  m.extra.erase("tensor");
  // ZeRO: every rank's parts are required.
  m.extra["zero"] = {{"stage", 1}};
  EXPECT_EQ(ckpt::requiredFiles(m), (std::vector<std::string>{"model.bin", ckpt::optimizerFile(true, 0),
                                                               ckpt::optimizerFile(true, 1)}));
}

}  // namespace
}  // namespace cohort::elastic
