// `cohort submit`, `cohort runs` and `cohort status` without a scheduler:
// what they write, and how they refuse bad input (exit 2, nothing left).

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "util/jobs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Submit, WithoutSbatchOnPathSubmitsNothing) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("tiny"));
  const auto r = test::cohort({"submit", dir.file("job.yaml"), "--slurm", "--run-dir", dir.file("run")},
                              {{"PATH", dir.path()}});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_TRUE(has(r.err, "sbatch is not on PATH")) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("run")));
}

TEST(Submit, ASweepKeyOutsideTheSchemaSubmitsNothing) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("tiny"));
  const auto r = test::cohort({"submit", dir.file("job.yaml"), "--slurm", "--dry-run", "--run-dir",
                               dir.file("sweep"), "--sweep", "training.optimizer.lrr=0.1,0.2"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_TRUE(has(r.err, "unknown key 'lrr' in 'training.optimizer'")) << r.err;
  EXPECT_FALSE(fs::exists(dir.file("sweep")));
  const auto bad = test::cohort({"submit", dir.file("job.yaml"), "--slurm", "--dry-run", "--sweep", "lr"});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_TRUE(has(bad.err, "--sweep lr: expected key.path=value1,value2")) << bad.err;
  const auto neither = test::cohort({"submit", dir.file("job.yaml")});
  EXPECT_EQ(neither.exitCode, 2) << neither.describe();
  EXPECT_TRUE(has(neither.err, "--slurm or --k8s")) << neither.err;
}

TEST(Submit, DryRunWritesTheScriptAndOneRunDirectoryPerPoint) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("tiny"));
  const auto r = test::cohort({"submit", dir.file("job.yaml"), "--slurm", "--dry-run", "--run-dir", dir.file("sweep"),
                               "--sweep", "training.optimizer.lr=0.05,0.1,0.2", "--time", "30", "--requeue"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string script = test::readText(dir.file("sweep/submit.sbatch"));
  EXPECT_TRUE(has(script, "#SBATCH --array=0-2")) << script;
  EXPECT_TRUE(has(script, "#SBATCH --time=30")) << script;
  EXPECT_TRUE(has(script, "#SBATCH --signal=B:USR2@120")) << script;  // stop_timeout_s 60 + 60
  EXPECT_TRUE(has(script, "#SBATCH --cpus-per-task=1")) << script;  // threads_per_rank
  for (const char* point : {"0-lr=0.05", "1-lr=0.1", "2-lr=0.2"}) {
    const std::string run = dir.file(std::string("sweep/") + point);
    const std::string job = test::readText(run + "/job.yaml");
    EXPECT_TRUE(has(script, run)) << script;
    EXPECT_TRUE(has(job, "store_token_file: " + run + "/store-token")) << job;
    struct stat st {};
    ASSERT_EQ(::stat((run + "/store-token").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 077, 0u);
  }
  EXPECT_TRUE(has(test::readText(dir.file("sweep/2-lr=0.2/job.yaml")), "lr: 0.2")) ;
  EXPECT_FALSE(fs::exists(dir.file("sweep/slurm.json")));  // not submitted
}

TEST(Submit, BadNodesOrRendezvousSubmitsNothing) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("tiny"));
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nodes", "3:2"}, "--nodes 3:2: expected N or MIN:MAX"},
      {{"--nodes", "0"}, "--nodes 0: expected N or MIN:MAX"},
      {{"--nodes", "two"}, "--nodes two: expected N or MIN:MAX"},
      {{"--rdzv", "etcd://h:2379"}, "--rdzv is for elastic training"},
      {{"--nodes", "1:2", "--rdzv", "store://h:1"}, "--rdzv store://h:1: expected etcd://"},
  };
  for (const auto& [extra, message] : cases) {
    std::vector<std::string> args = {"submit", dir.file("job.yaml"), "--slurm", "--dry-run", "--run-dir", dir.file("run")};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = test::cohort(args);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_TRUE(has(r.err, message)) << r.err;
    EXPECT_FALSE(fs::exists(dir.file("run")));
  }
  const auto k8s = test::cohort({"submit", dir.file("job.yaml"), "--k8s", "--nodes", "1:2", "--run-dir", dir.file("run")});
  EXPECT_EQ(k8s.exitCode, 2) << k8s.describe();
  EXPECT_TRUE(has(k8s.err, "is for --slurm")) << k8s.err;
}

TEST(Submit, FreePortPrintsATcpPort) {
  const auto r = test::cohort({"free-port"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const int port = std::stoi(r.out);
  // Below the kernel's ephemeral range, where no outgoing connection's local
  // port lands between this command and the server's bind.
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  ASSERT_TRUE(range >> low >> high);
  EXPECT_GE(port, 1024);
  EXPECT_LT(port, low);
  // And free: a server can listen on it.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << port << ": " << std::strerror(errno);
  ::close(fd);
}

TEST(Submit, K8sPrintsAnIndexedJob) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("tiny"));
  const auto r = test::cohort({"submit", dir.file("job.yaml"), "--k8s", "--nodes", "3", "--image", "reg/cohort:2",
                               "--run-dir", dir.file("run")});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(has(r.out, "completions: 3")) << r.out;
  EXPECT_TRUE(has(r.out, "image: reg/cohort:2")) << r.out;
  EXPECT_EQ(test::readText(dir.file("run/k8s.yaml")).substr(0, 40), r.out.substr(0, 40));
}

TEST(Runs, ListsALocalRunAndRefusesAMissingDirectory) {
  test::TempDir dir;
  test::writeText(dir.file("job.yaml"), test::tinyJobYaml("tiny"));
  const auto train = test::cohort({"run", dir.file("job.yaml"), "--run-dir", dir.file("runs/a"), "--set",
                                   "training.max_steps=4"});
  ASSERT_EQ(train.exitCode, 0) << train.describe();
  const auto runs = test::cohort({"runs", dir.file("runs")});
  ASSERT_EQ(runs.exitCode, 0) << runs.describe();
  EXPECT_TRUE(has(runs.out, "a ")) << runs.out;
  EXPECT_TRUE(has(runs.out, "completed")) << runs.out;
  const auto status = test::cohort({"status", dir.file("runs/a")});
  ASSERT_EQ(status.exitCode, 0) << status.describe();
  EXPECT_TRUE(has(status.out, "state       completed")) << status.out;
  EXPECT_TRUE(has(status.out, "step        4")) << status.out;
  const auto missing = test::cohort({"runs", dir.file("nowhere")});
  EXPECT_EQ(missing.exitCode, 2) << missing.describe();
  EXPECT_TRUE(has(missing.err, dir.file("nowhere"))) << missing.err;
  const auto cancel = test::cohort({"cancel", dir.file("runs/a")});
  EXPECT_EQ(cancel.exitCode, 2) << cancel.describe();
  EXPECT_TRUE(has(cancel.err, "not submitted to Slurm")) << cancel.err;
}

}  // namespace
}  // namespace cohort
