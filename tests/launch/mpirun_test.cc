// `mpirun -np 2 cohort worker job.yaml` (Debian's OpenMPI): the ranks take
// their place from OMPI_COMM_WORLD_* and train together.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "util/jobs.h"

namespace cohort {
namespace {

TEST(Mpirun, TwoRanksUnderOpenMpi) {
  const std::string mpirun = "/usr/bin/mpirun";
  ASSERT_TRUE(std::filesystem::exists(mpirun)) << "OpenMPI is not installed (openmpi-bin)";
  test::TempDir dir;
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("mpi"));
  const int port = test::freePort();
  auto r = test::run({mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
                      "MASTER_ADDR=127.0.0.1", "-x", "MASTER_PORT=" + std::to_string(port),
                      test::cohortBin(), "worker", job, "--run-dir", dir.file("run"), "--set",
                      "training.max_steps=4"},
                     {{"OMPI_MCA_plm_rsh_agent", ""}}, std::chrono::minutes(5));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto summary = nlohmann::json::parse(test::readText(dir.file("run/summary.json")));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["steps"], 4);
  EXPECT_TRUE(std::filesystem::exists(dir.file("run/model/final.pt")));
  EXPECT_NE(test::readText(dir.file("run/logs/rank-1.log")).find("rank 1/2 started by openmpi"),
            std::string::npos);
}

}  // namespace
}  // namespace cohort
