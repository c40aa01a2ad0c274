// The mesh (parallel/mesh.h): the job's ranks as replicas x stages x tensor
// ranks, each rank's coordinates and its named groups, formed by real
// process groups of ranks that run as threads; and the error of a shape
// that does not divide the world.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <string>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/core/error.h"
#include "cohort/parallel/mesh.h"
#include "util/rank_threads.h"

namespace cohort::parallel {
namespace {

struct Seen {
  int stage = -1, replica = -1, tensorRank = -1;
  std::vector<int> tensor, pipeline, data;  // each group's members (job ranks)
  double tensorSum = 0, pipelineSum = 0, dataSum = 0;
};

// The members of `c`: its job ranks, or every rank of the job.
std::vector<int> members(const comm::Comm& c, int world) {
  if (!c.jobRanks.empty()) return c.jobRanks;
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  return all;
}

// The sum of the job ranks of `c`'s members, by an allreduce over it.
double sumOfRanks(const comm::Comm& c, int jobRank) {
  at::Tensor t = torch::tensor({double(jobRank)}, torch::kFloat64);
  comm::allreduceSum(c, t, "mesh test");
  return t.item<double>();
}

std::vector<Seen> build(int world, const MeshShape& shape, const std::string& prefix) {
  std::vector<Seen> seen(static_cast<size_t>(world));
  std::mutex mutex;
  test::withRankThreads(world, prefix, [&](const comm::Comm& c) {
    const Mesh m = buildMesh(c, shape);
    Seen s;
    s.stage = m.stage;
    s.replica = m.replica;
    s.tensorRank = m.tensorRank;
    s.tensor = members(m.tensor, world);
    s.pipeline = members(m.pipeline, world);
    s.data = members(m.data, world);
    s.tensorSum = sumOfRanks(m.tensor, c.rank);
    s.pipelineSum = sumOfRanks(m.pipeline, c.rank);
    s.dataSum = sumOfRanks(m.data, c.rank);
    // The groups' own ranks are the coordinates.
    EXPECT_EQ(m.tensor.rank, m.tensorRank);
    EXPECT_EQ(m.pipeline.rank, m.stage);
    EXPECT_EQ(m.data.rank, m.replica);
    EXPECT_EQ(m.jobRank(m.replica, m.stage, m.tensorRank), c.rank);
    std::lock_guard<std::mutex> lock(mutex);
    seen[static_cast<size_t>(c.rank)] = s;
  });
  return seen;
}

double sum(const std::vector<int>& v) {
  double s = 0;
  for (int x : v) s += x;
  return s;
}

TEST(Mesh, TensorRanksAreInnermostAndEachGroupSumsOverItsMembersOnly) {
  // 2 replicas x 2 stages x 2 tensor ranks.
  const std::vector<Seen> seen = build(8, MeshShape{2, 2}, "mesh-3d");
  for (int r = 0; r < 8; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(s.tensorRank, r % 2);
    EXPECT_EQ(s.stage, (r / 2) % 2);
    EXPECT_EQ(s.replica, r / 4);
    const int base = r - r % 2;
    EXPECT_EQ(s.tensor, (std::vector<int>{base, base + 1}));
    // Same replica and slice, each stage.
    EXPECT_EQ(s.pipeline, (std::vector<int>{s.replica * 4 + s.tensorRank, s.replica * 4 + 2 + s.tensorRank}));
    // Same stage and slice, each replica.
    EXPECT_EQ(s.data, (std::vector<int>{s.stage * 2 + s.tensorRank, 4 + s.stage * 2 + s.tensorRank}));
    EXPECT_EQ(s.tensorSum, sum(s.tensor));
    EXPECT_EQ(s.pipelineSum, sum(s.pipeline));
    EXPECT_EQ(s.dataSum, sum(s.data));
  }
}

TEST(Mesh, WithoutATensorSplitThePipelineLayoutIsUnchanged) {
  // 2 replicas x 2 stages: job rank = replica x stages + stage, as ever;
  // the tensor group is the rank alone.
  const std::vector<Seen> seen = build(4, MeshShape{2, 1}, "mesh-2d");
  for (int r = 0; r < 4; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(s.stage, r % 2);
    EXPECT_EQ(s.replica, r / 2);
    EXPECT_EQ(s.tensorRank, 0);
    EXPECT_EQ(s.tensor, (std::vector<int>{r}));
    EXPECT_EQ(s.tensorSum, r);
    EXPECT_EQ(s.pipeline, (std::vector<int>{r - r % 2, r - r % 2 + 1}));
    EXPECT_EQ(s.data, (std::vector<int>{r % 2, 2 + r % 2}));
  }
}

TEST(Mesh, AShapeThatDoesNotDivideTheWorldNamesTheKeyAndTheCounts) {
  std::mutex mutex;
  std::vector<std::string> errors;
  test::withRankThreads(6, "mesh-bad", [&](const comm::Comm& c) {
    try {
      buildMesh(c, MeshShape{2, 2});
      ADD_FAILURE() << "rank " << c.rank << ": a mesh of 2 x 2 over 6 ranks was built";
    } catch (const ConfigError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      errors.push_back(e.what());
    }
  });
  ASSERT_EQ(errors.size(), 6u);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("distribution.pipeline.stages"), std::string::npos) << e;
    EXPECT_NE(e.find("2 x 2 ranks do not divide the 6 ranks"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace cohort::parallel
