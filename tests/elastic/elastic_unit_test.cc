// The parts of elastic training that need no process: the batch policy,
// the --rdzv URL, and the held state a node keeps in memory.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "cohort/ckpt/held_state.h"
#include "cohort/ckpt/rank_state.h"
#include "cohort/config/job.h"
#include "cohort/core/error.h"
#include "cohort/elastic/agent.h"
#include "cohort/elastic/batch_policy.h"
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
  applyBatchPolicy(j, 12);
  EXPECT_EQ(j.training.accumulateSteps, 1);
  j = nominal(BatchPolicy::keepGlobal);
  applyBatchPolicy(j, 2);
  EXPECT_EQ(j.training.accumulateSteps, 6);
  j = nominal(BatchPolicy::keepGlobal);
  try {
    applyBatchPolicy(j, 8);  // 96 / (8 x 8) is not whole
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("8 ranks"), std::string::npos) << e.what();
  }
  // The agent checks every size up front: 1..3 nodes of 2 ranks (2, 4, 6).
  EXPECT_NO_THROW(checkBatchPolicy(nominal(BatchPolicy::keepGlobal), 1, 3));
  EXPECT_THROW(checkBatchPolicy(nominal(BatchPolicy::keepGlobal), 1, 4), ConfigError);
}

TEST(BatchPolicy, KeepPerRankScalesTheLearningRateLinearly) {
  JobConfig j = nominal(BatchPolicy::keepPerRank);
  applyBatchPolicy(j, 6);
  EXPECT_EQ(j.training.accumulateSteps, 3);
  EXPECT_EQ(j.training.optimizer.baseBatch, 96);  // lr 0.1 at 96; 0.15 at 144
  j = nominal(BatchPolicy::keepPerRank);
  j.training.optimizer.baseBatch = 256;  // the job's own rule stays
  applyBatchPolicy(j, 6);
  EXPECT_EQ(j.training.optimizer.baseBatch, 256);
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
  // ZeRO: every rank's parts are required.
  m.extra["zero"] = {{"stage", 1}};
  EXPECT_EQ(ckpt::requiredFiles(m), (std::vector<std::string>{"model.bin", ckpt::optimizerFile(true, 0),
                                                               ckpt::optimizerFile(true, 1)}));
}

}  // namespace
}  // namespace cohort::elastic
