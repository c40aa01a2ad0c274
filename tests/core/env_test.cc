#include <gtest/gtest.h>
#include <stdlib.h>

#include "cohort/core/env.h"
#include "cohort/core/error.h"

namespace cohort {
namespace {

// Sets variables for one test and restores a clean slate afterwards.
class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override { clearAll(); }
  void TearDown() override { clearAll(); }
  static void clearAll() {
    for (const char* v :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
          "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "COHORT_AGENT_STORE",
          "COHORT_FAULT", "COHORT_MACHINE_ID"}) {
      unsetenv(v);
    }
  }
  static void set(const char* k, const char* v) { setenv(k, v, 1); }
};

TEST_F(EnvTest, NoLauncherIsASingleRank) {
  env::RankEnv r = env::detectRankEnv();
  EXPECT_EQ(r.source, "none");
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.worldSize, 1);
  EXPECT_FALSE(r.masterFromEnv);
}

TEST_F(EnvTest, TorchrunVariables) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "2");
  set("MASTER_ADDR", "10.0.0.5");
  set("MASTER_PORT", "29555");
  env::RankEnv r = env::detectRankEnv();
  EXPECT_EQ(r.source, "torchrun");
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.worldSize, 8);
  EXPECT_EQ(r.localRank, 1);
  EXPECT_EQ(r.localWorldSize, 2);
  EXPECT_EQ(r.masterAddr, "10.0.0.5");
  EXPECT_EQ(r.masterPort, 29555);
  EXPECT_TRUE(r.masterFromEnv);
}

TEST_F(EnvTest, OpenMpiVariables) {
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  env::RankEnv r = env::detectRankEnv();
  EXPECT_EQ(r.source, "openmpi");
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.worldSize, 4);
  EXPECT_EQ(r.localWorldSize, 2);
  EXPECT_EQ(r.masterAddr, "127.0.0.1");
  EXPECT_EQ(r.masterPort, 29500);
}

TEST_F(EnvTest, SlurmVariablesWithTasksPerNodeList) {
  set("SLURM_PROCID", "5");
  set("SLURM_NTASKS", "7");
  set("SLURM_LOCALID", "1");
  set("SLURM_NODEID", "2");
  set("SLURM_TASKS_PER_NODE", "2(x2),3");
  env::RankEnv r = env::detectRankEnv();
  EXPECT_EQ(r.source, "slurm");
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.worldSize, 7);
  EXPECT_EQ(r.localRank, 1);
  EXPECT_EQ(r.localWorldSize, 3);
}

TEST_F(EnvTest, TorchrunTakesPrecedenceOverMpi) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  EXPECT_EQ(env::detectRankEnv().source, "torchrun");
}

TEST_F(EnvTest, BadValuesNameTheVariable) {
  set("RANK", "x");
  set("WORLD_SIZE", "2");
  try {
    env::detectRankEnv();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK: expected a non-negative integer, got 'x'"),
              std::string::npos)
        << e.what();
  }
  set("RANK", "2");
  EXPECT_THROW(env::detectRankEnv(), ConfigError);  // rank >= world size
  set("RANK", "1");
  set("MASTER_PORT", "70000");
  EXPECT_THROW(env::detectRankEnv(), ConfigError);
  unsetenv("MASTER_PORT");
  unsetenv("WORLD_SIZE");
  try {
    env::detectRankEnv();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE is not set"), std::string::npos);
  }
}

TEST_F(EnvTest, RankVariablesRoundTrip) {
  env::RankEnv r;
  r.rank = 1;
  r.worldSize = 3;
  r.localRank = 1;
  r.localWorldSize = 3;
  r.masterAddr = "127.0.0.1";
  r.masterPort = 4242;
  r.agentStore = true;
  for (const auto& [k, v] : env::rankVariables(r)) set(k.c_str(), v.c_str());
  env::RankEnv back = env::detectRankEnv();
  EXPECT_EQ(back.rank, 1);
  EXPECT_EQ(back.worldSize, 3);
  EXPECT_EQ(back.masterPort, 4242);
  EXPECT_TRUE(back.agentStore);
}

TEST_F(EnvTest, FaultSpec) {
  EXPECT_FALSE(env::fault().has_value());
  set("COHORT_FAULT", "exit3@rank1:step5");
  auto f = env::fault();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->action, env::Fault::Action::exit);
  EXPECT_EQ(f->exitCode, 3);
  EXPECT_EQ(f->rank, 1);
  EXPECT_EQ(f->step, 5);
  set("COHORT_FAULT", "kill@rank0:step2");
  EXPECT_EQ(env::fault()->action, env::Fault::Action::kill);
  set("COHORT_FAULT", "explode");
  EXPECT_THROW(env::fault(), ConfigError);
}

TEST_F(EnvTest, MachineIdForEveryRankOrPerRank) {
  EXPECT_FALSE(env::machineId(0).has_value());
  set("COHORT_MACHINE_ID", "rack3-node7");
  EXPECT_EQ(env::machineId(0), "rack3-node7");
  EXPECT_EQ(env::machineId(5), "rack3-node7");
  set("COHORT_MACHINE_ID", "a,a,b,b");
  EXPECT_EQ(env::machineId(0), "a");
  EXPECT_EQ(env::machineId(1), "a");
  EXPECT_EQ(env::machineId(2), "b");
  EXPECT_EQ(env::machineId(3), "b");
  try {
    env::machineId(4);
    FAIL() << "a list of 4 placed rank 4";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no machine for rank 4"), std::string::npos) << e.what();
  }
  set("COHORT_MACHINE_ID", "a,,b");
  EXPECT_THROW(env::machineId(1), ConfigError);
}

}  // namespace
}  // namespace cohort
