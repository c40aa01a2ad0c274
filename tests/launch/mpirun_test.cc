// `mpirun -np 2 cohort worker job.yaml` (Debian's OpenMPI): the ranks take
// their place from OMPI_COMM_WORLD_* and train together, on one machine and
// on two test hosts (network namespaces) that mpirun reaches through a
// remote shell of the test's.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cohort/ckpt/state_dict.h"
#include "util/jobs.h"
#include "util/netns.h"
#include "util/runs.h"
#include "util/skip.h"

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
                     {{"OMPI_MCA_plm_rsh_agent", ""}, {"TMPDIR", dir.path()}}, std::chrono::minutes(5));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto summary = nlohmann::json::parse(test::readText(dir.file("run/summary.json")));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["steps"], 4);
  EXPECT_TRUE(std::filesystem::exists(dir.file("run/model/final.pt")));
  EXPECT_NE(test::readText(dir.file("run/logs/rank-1.log")).find("rank 1/2 started by openmpi"),
            std::string::npos);
}

TEST(Mpirun, TwoHostsUnderOpenMpi) {
  const std::string why = test::TestNetwork::unavailable();
  if (!why.empty()) COHORT_SKIP(why);
  const std::string mpirun = "/usr/bin/mpirun";
  ASSERT_TRUE(std::filesystem::exists(mpirun)) << "OpenMPI is not installed (openmpi-bin)";
  test::TestNetwork net(2);
  test::TempDir dir;
  // mpirun starts its daemon on each host through this "remote shell": the
  // host's network namespace stands for the machine. The hosts share this
  // machine's hostname and /tmp, where OpenMPI's daemons would race to create
  // the same session directory, so each host gets a temporary directory of
  // its own, as a machine of its own would.
  std::string rsh = "#!/bin/sh\nhost=$1; shift\ncase $host in\n";
  for (int h = 0; h < 2; ++h) {
    const auto enter = net.enter(h);
    const std::string tmp = dir.file("tmp-host" + std::to_string(h));
    std::filesystem::create_directories(tmp);
    rsh += "  " + net.address(h) + ") exec /usr/bin/env TMPDIR=" + tmp + " " + enter[0] + " " + enter[1] +
           " /bin/sh -c \"$*\" ;;\n";
  }
  rsh += "esac\necho \"no test host $host\" >&2\nexit 1\n";
  test::writeText(dir.file("rsh"), rsh);
  std::filesystem::permissions(dir.file("rsh"), std::filesystem::perms::owner_all);
  const std::string job = dir.file("job.yaml");
  test::writeText(job, test::tinyJobYaml("mpi"));
  const std::string subnet = net.bridgeAddress().substr(0, net.bridgeAddress().rfind('.')) + ".0/24";
  auto r = test::run({mpirun, "--allow-run-as-root", "--host", net.address(0) + "," + net.address(1), "-np", "2",
                      "--mca", "plm_rsh_agent", dir.file("rsh"), "--mca", "routed", "direct", "--mca",
                      "oob_tcp_if_include", subnet, "-x", "MASTER_ADDR=" + net.address(0), "-x",
                      "MASTER_PORT=29511", "-x", "COHORT_STORE_TOKEN=mpirun-test-token-0123456789", test::cohortBin(),
                      "worker", job, "--run-dir", dir.file("run")},
                     {{"TMPDIR", dir.path()}}, std::chrono::minutes(5));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  auto summary = nlohmann::json::parse(test::readText(dir.file("run/summary.json")));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_NE(test::readText(dir.file("run/logs/rank-1.log")).find("rank 1/2 started by openmpi"), std::string::npos);
  // The two hosts trained as two ranks of one machine do.
  const auto local = test::cohort({"run", job, "--run-dir", dir.file("local"), "--procs", "2"});
  ASSERT_EQ(local.exitCode, 0) << local.describe();
  EXPECT_LT(test::maxDifference(ckpt::readStateDict(dir.file("run/model/final.pt")),
                                ckpt::readStateDict(dir.file("local/model/final.pt"))),
            1e-6);
}

}  // namespace
}  // namespace cohort
