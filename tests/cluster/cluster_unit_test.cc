// The pieces of `cohort submit` and `cohort runs` that need no scheduler:
// the sbatch script, sweeps, the Kubernetes manifest, run records and what
// a run directory says of its state.

#include <gtest/gtest.h>

#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "cohort/cluster/k8s.h"
#include "cohort/cluster/record.h"
#include "cohort/cluster/runs.h"
#include "cohort/cluster/slurm.h"
#include "cohort/cluster/sweep.h"
#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/text.h"
#include "cohort/launch/debug.h"
#include "util/process.h"

namespace cohort::cluster {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

SlurmRequest request() {
  SlurmRequest r;
  r.jobName = "tiny";
  r.nodes = 2;
  r.tasksPerNode = 4;
  r.cpusPerTask = 3;
  r.cohortBinary = "/opt/cohort bin/cohort";
  r.runDirs = {"/runs/tiny"};
  r.outputFile = "/runs/tiny/slurm-%j.out";
  return r;
}

TEST(SbatchScript, AsksForTheJobsShapeAndTheWarningSignal) {
  SlurmRequest r = request();
  r.partition = "gpu";
  r.time = "2:00:00";
  r.account = "ml";
  r.gpusPerNode = 8;
  r.warnSeconds = 150;
  const std::string s = sbatchScript(r);
  for (const char* line : {"#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=4\n", "#SBATCH --cpus-per-task=3\n",
                           "#SBATCH --gpus-per-node=8\n", "#SBATCH --partition=gpu\n", "#SBATCH --time=2:00:00\n",
                           "#SBATCH --account=ml\n", "#SBATCH --signal=B:USR2@150\n", "#SBATCH --no-requeue\n",
                           "#SBATCH --output=/runs/tiny/slurm-%j.out\n"}) {
    EXPECT_TRUE(has(s, line)) << line << "\n" << s;
  }
  EXPECT_FALSE(has(s, "--array")) << s;
  // A path with a space is quoted; srun repeats --cpus-per-task (22.05 reads it no longer).
  EXPECT_TRUE(has(s, "cohort='/opt/cohort bin/cohort'")) << s;
  EXPECT_TRUE(has(s, "srun --wait=120 --cpus-per-task=3 \"$cohort\" worker \"$run_dir/job.yaml\"")) << s;
  EXPECT_TRUE(has(s, "requeue=0\n")) << s;
  // The store's port: free on the first node when each attempt starts.
  EXPECT_TRUE(has(s, "  MASTER_PORT=$(\"$cohort\" free-port) || exit 1\n  export MASTER_PORT\n")) << s;
  r.masterPort = 29555;
  EXPECT_TRUE(has(sbatchScript(r), "  export MASTER_PORT=29555")) << sbatchScript(r);
}

TEST(SbatchScript, RequeueAndArrays) {
  SlurmRequest r = request();
  r.requeue = true;
  r.runDirs = {"/s/0-lr=0.1", "/s/1-lr=0.2", "/s/2-lr=0.3"};
  const std::string s = sbatchScript(r);
  EXPECT_TRUE(has(s, "#SBATCH --requeue\n")) << s;
  EXPECT_TRUE(has(s, "#SBATCH --array=0-2\n")) << s;
  EXPECT_TRUE(has(s, "run_dir=${run_dirs[$SLURM_ARRAY_TASK_ID]}")) << s;
  EXPECT_TRUE(has(s, "  /s/1-lr=0.2\n")) << s;
  EXPECT_TRUE(has(s, "scontrol requeue \"$SLURM_JOB_ID\"")) << s;
  EXPECT_TRUE(has(s, "RequeueExit=75")) << s;
}

TEST(SbatchScript, IsValidBash) {
  SlurmRequest r = request();
  r.requeue = true;
  r.runDirs = {"/s/a", "/s/it's"};
  test::TempDir dir;
  test::writeText(dir.file("s.sh"), sbatchScript(r));
  const auto res = test::run({"/bin/bash", "-n", dir.file("s.sh")});
  EXPECT_EQ(res.exitCode, 0) << res.describe();
}

// The script's handling of stops, run by bash with a stand-in srun,
// scontrol and cohort (free-port) on PATH.
struct FakeSlurm {
  explicit FakeSlurm(const std::string& srunBody, bool elastic = false) {
    std::filesystem::create_directories(dir.file("bin"));
    const auto tool = [&](const std::string& name, const std::string& body) {
      test::writeText(dir.file("bin/" + name), "#!/bin/bash\n" + body + "\n");
      std::filesystem::permissions(dir.file("bin/" + name), std::filesystem::perms::owner_all);
    };
    tool("srun", srunBody);
    tool("scontrol", "echo \"$@\" >> " + dir.file("scontrol.log"));
    tool("cohort", "echo 29500");
    SlurmRequest r = request();
    r.requeue = true;
    r.cohortBinary = dir.file("bin/cohort");
    r.runDirs = {dir.file("run")};
    if (elastic) r.maxNodes = 2;
    test::writeText(dir.file("job.sbatch"), sbatchScript(r));
  }
  std::map<std::string, std::string> env() const {
    return {{"PATH", dir.file("bin") + ":/usr/bin:/bin"}, {"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "n1"},
            {"SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"}, {"DIR", dir.path()}};
  }
  test::TempDir dir;
};

TEST(SbatchScript, ATaskKilledByTheWarningIsAStopThatRequeues) {
  FakeSlurm slurm("exit 140");  // what srun says when a task died of SIGUSR2
  const auto r = test::run({"/bin/bash", slurm.dir.file("job.sbatch")}, slurm.env(), std::chrono::seconds(60));
  EXPECT_EQ(r.exitCode, 75) << r.describe();
  EXPECT_TRUE(has(r.out, "a task ended by the time limit's warning")) << r.out;
  EXPECT_FALSE(has(r.out, "restart 1 of")) << r.out;
  EXPECT_EQ(test::readText(slurm.dir.file("scontrol.log")), "requeue 7\n");
}

TEST(SbatchScript, TheWarningToTheScriptReachesTheRunningStep) {
  for (const bool elastic : {false, true}) {
    // A step that runs until it gets SIGUSR2, then stops as the ranks do.
    FakeSlurm slurm("trap 'exit 75' USR2\ntouch \"$DIR/started\"\n"
                    "for i in $(seq 1200); do sleep 0.05; done\nexit 9",
                    elastic);
    test::Process script({"/bin/bash", slurm.dir.file("job.sbatch")}, slurm.env());
    ASSERT_TRUE(test::waitUntil([&] { return std::filesystem::exists(slurm.dir.file("started")); },
                                std::chrono::seconds(30)))
        << script.stderrSoFar();
    script.signal(SIGUSR2);  // --signal=B:USR2: to the batch shell only
    const auto r = script.wait(std::chrono::seconds(60));
    EXPECT_EQ(r.exitCode, 75) << r.describe();
    EXPECT_TRUE(has(r.out, "stopped after a checkpoint")) << r.out;
    EXPECT_EQ(test::readText(slurm.dir.file("scontrol.log")), "requeue 7\n") << elastic;
  }
}

TEST(SbatchScript, ElasticRunsOneAgentPerNode) {
  SlurmRequest r = request();
  r.maxNodes = 4;
  r.requeue = true;
  const std::string s = sbatchScript(r);
  // No task count for a range: Slurm would give no more nodes than tasks.
  EXPECT_FALSE(has(s, "#SBATCH --ntasks")) << s;
  for (const char* line : {"#SBATCH --nodes=2-4\n", "#SBATCH --spread-job\n", "#SBATCH --cpus-per-task=12\n",
                           "#SBATCH --no-kill\n", "#SBATCH --signal=B:USR2@120\n", "#SBATCH --requeue\n"}) {
    EXPECT_TRUE(has(s, line)) << line << "\n" << s;
  }
  // The agent shares its task's CPUs among the node's 4 ranks; a name of its
  // own per start of the job; the first node's address from srun.
  EXPECT_TRUE(has(s, "srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 --wait=0 --cpus-per-task=12")) << s;
  EXPECT_TRUE(has(s, "agent \"$1/job.yaml\" --run-dir \"$1\" --nnodes 2:4 --procs 4 --on-sigterm stop")) << s;
  EXPECT_TRUE(has(s, "--rdzv \"store://$SLURM_LAUNCH_NODE_IPADDR:$2/$3\"")) << s;
  EXPECT_TRUE(has(s, "rdzv_id=\"slurm-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}\"")) << s;
  EXPECT_TRUE(has(s, "scontrol requeue")) << s;
  // The agents restart failed ranks; the script does not loop.
  EXPECT_FALSE(has(s, "max_restarts=")) << s;
  EXPECT_FALSE(has(s, "while :")) << s;
  EXPECT_FALSE(has(s, " worker ")) << s;
  r.rdzv = "etcd://10.0.0.5:2379,10.0.0.6:2379";
  r.maxNodes = 2;
  const std::string e = sbatchScript(r);
  EXPECT_TRUE(has(e, "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n")) << e;
  EXPECT_TRUE(has(e, "--rdzv etcd://10.0.0.5:2379,10.0.0.6:2379/\"$rdzv_id\"")) << e;
  EXPECT_FALSE(has(e, "free-port")) << e;
  test::TempDir dir;
  for (const std::string& text : {s, e}) {
    test::writeText(dir.file("s.sh"), text);
    const auto res = test::run({"/bin/bash", "-n", dir.file("s.sh")});
    EXPECT_EQ(res.exitCode, 0) << res.describe() << text;
  }
  r.nodes = 3;
  EXPECT_THROW(sbatchScript(r), UsageError);  // MIN above MAX
}

TEST(SbatchScript, RefusesWhatSlurmCouldNotTake) {
  SlurmRequest r = request();
  r.runDirs.clear();
  EXPECT_THROW(sbatchScript(r), UsageError);
  r = request();
  r.nodes = 0;
  EXPECT_THROW(sbatchScript(r), UsageError);
}

TEST(SubmitNodes, CountOrRange) {
  EXPECT_EQ(parseCountRange("3"), std::make_pair(int64_t{3}, int64_t{3}));
  EXPECT_EQ(parseCountRange("1:4"), std::make_pair(int64_t{1}, int64_t{4}));
  for (const char* bad : {"", ":", "1:", ":2", "-1", "1-4", "2:x", "1:2:3", "9999999999"}) {
    EXPECT_FALSE(parseCountRange(bad).has_value()) << bad;
  }
}

TEST(SbatchScript, ParsesTheJobId) {
  EXPECT_EQ(parseSubmittedJobId("1234\n"), "1234");
  EXPECT_EQ(parseSubmittedJobId("77;cluster\n"), "77");
  EXPECT_THROW(parseSubmittedJobId("sbatch: error: no\n"), Error);
  EXPECT_THROW(parseSubmittedJobId(""), Error);
}

TEST(Sweep, SpansTheProductFirstAxisSlowest) {
  const auto axes = parseSweeps({"training.optimizer.lr=0.05,0.1", "training.batch_size=8,16,32"});
  const auto points = sweepPoints(axes);
  ASSERT_EQ(points.size(), 6u);
  EXPECT_EQ(points[0].overrides, (std::vector<std::string>{"training.optimizer.lr=0.05", "training.batch_size=8"}));
  EXPECT_EQ(points[5].overrides, (std::vector<std::string>{"training.optimizer.lr=0.1", "training.batch_size=32"}));
  EXPECT_EQ(points[1].label, "lr=0.05,batch_size=16");
  EXPECT_EQ(sweepPoints({}).size(), 1u);
  EXPECT_EQ(sweepPoints(parseSweeps({"model.arch=a/b"}))[0].label, "arch=a_b");
}

TEST(Sweep, RefusesMalformedOptions) {
  for (const char* bad : {"training.optimizer.lr", "=1,2", "training.optimizer.lr=0.1,,0.2", "a.b="}) {
    EXPECT_THROW(parseSweeps({bad}), UsageError) << bad;
  }
  EXPECT_THROW(parseSweeps({"a.b=1", "a.b=2"}), UsageError);
}

TEST(K8s, AnIndexedJobOfOnePodPerRank) {
  K8sRequest k;
  k.name = "Tiny_Job";
  k.image = "registry/cohort:1";
  k.ranks = 4;
  k.runDir = "/runs/tiny";
  k.gpusPerRank = 1;
  const std::string m = k8sManifest(k);
  EXPECT_TRUE(has(m, "completionMode: Indexed")) << m;
  EXPECT_TRUE(has(m, "completions: 4")) << m;
  EXPECT_TRUE(has(m, "batch.kubernetes.io/job-completion-index")) << m;
  EXPECT_TRUE(has(m, "value: tiny-job-0.tiny-job")) << m;
  EXPECT_TRUE(has(m, "nvidia.com/gpu: \"1\"")) << m;
  EXPECT_TRUE(has(m, "image: registry/cohort:1")) << m;
  EXPECT_EQ(dnsLabel("--A..b--"), "a--b");
  EXPECT_EQ(dnsLabel("___"), "cohort");
}

// --debug and --debug-on-failure of `cohort submit` reach the ranks as
// variables the script exports (or the pods' environment), checked against
// the job's ranks where they are given.
TEST(SubmitDebug, TheScriptAndTheManifestPassTheOptionsToTheRanks) {
  const launch::DebugOptions o{"3,1", 60};
  SlurmRequest r = request();
  r.env = launch::debugEnvironment(o, 4, false);
  const std::string s = sbatchScript(r);
  EXPECT_TRUE(has(s, "export COHORT_DEBUG_RANKS=1,3")) << s;
  EXPECT_TRUE(has(s, "export COHORT_DEBUG_ON_FAILURE=60")) << s;
  test::TempDir dir;
  test::writeText(dir.file("s.sh"), s);
  EXPECT_EQ(test::run({"/bin/bash", "-n", dir.file("s.sh")}).exitCode, 0);
  K8sRequest k;
  k.name = "tiny";
  k.env = launch::debugEnvironment(o, 4, false);
  const std::string m = k8sManifest(k);
  EXPECT_TRUE(has(m, "            - name: COHORT_DEBUG_RANKS\n              value: \"1,3\"\n")) << m;
  EXPECT_TRUE(launch::debugEnvironment({}, 4, false).empty());
}

TEST(SubmitDebug, RanksOutsideTheJobAreUsageErrorsNamingTheOption) {
  EXPECT_EQ(launch::parseDebugRanks("2,0,2", 4), (std::vector<int>{0, 2}));
  EXPECT_EQ(launch::parseDebugRanks("7", 0), (std::vector<int>{7}));  // no world known: not bounded
  for (const char* bad : {"4", "-1", "x", "1,", ",1", "1;2", " 1", "1.5", ""}) {
    try {
      launch::parseDebugRanks(bad, 4);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const UsageError& e) {
      EXPECT_TRUE(has(e.what(), "--debug")) << e.what();
    }
  }
  EXPECT_THROW(launch::debugEnvironment({"1", -5}, 4, false), UsageError);
}

TEST(Record, RoundTripsAndNamesABadFile) {
  test::TempDir dir;
  SlurmRecord r{"4242", 2, "/x/submit.sbatch", "2026-11-28T10:00:00Z", {"training.optimizer.lr=0.1"}};
  writeSlurmRecord(dir.path(), r);
  const auto back = readSlurmRecord(dir.path());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->ref(), "4242_2");
  EXPECT_EQ(back->overrides, r.overrides);
  EXPECT_FALSE(readSlurmRecord(dir.file("none")));
  test::writeText(slurmRecordPath(dir.path()), "{\"script\": 1}");
  try {
    readSlurmRecord(dir.path());
    FAIL() << "a record without a job id was read";
  } catch (const DataError& e) {
    EXPECT_TRUE(has(e.what(), slurmRecordPath(dir.path()))) << e.what();
  }
}

// A run directory as a run leaves it: job.yaml, logs, metrics, maybe a summary.
void fakeRun(const std::string& dir, bool completed, bool checkpoint) {
  std::filesystem::create_directories(dir + "/logs");
  test::writeText(dir + "/job.yaml", "name: tiny\nmodel:\n  arch: simple_cnn\n");
  test::writeText(dir + "/logs/rank-0.log", "2026-11-28 10:00:00.000 info [rank 0/1] started\n");
  test::writeText(dir + "/metrics.jsonl",
                  "{\"event\":\"train\",\"step\":10,\"loss\":0.9}\n"
                  "{\"event\":\"eval\",\"step\":10,\"top1\":0.61,\"loss\":1.1}\n"
                  "{\"event\":\"train\",\"step\":20,\"loss\":0.5}\n"
                  "{\"event\":\"eval\",\"step\":20,\"top1\":0.58,\"loss\":1.0}\n"
                  "{\"event\":\"train\",\"st");  // torn by a kill
  if (completed) {
    test::writeText(dir + "/summary.json", "{\"job\":\"tiny\",\"status\":\"completed\",\"steps\":24,\"wall_time_s\":75}");
  }
  if (checkpoint) {
    std::filesystem::create_directories(dir + "/checkpoints/step-20");
    test::writeText(dir + "/checkpoints/step-20/manifest.json", "{}");
    std::filesystem::create_directories(dir + "/checkpoints/step-30");  // never committed
  }
}

TEST(Runs, StateStepBestAndTimeFromTheRunDirectory) {
  test::TempDir dir;
  fakeRun(dir.file("done"), true, false);
  fakeRun(dir.file("sweep/0-lr=0.1"), false, true);
  const auto runs = findRuns(dir.path());
  ASSERT_EQ(runs.size(), 2u);
  const RunInfo done = describeRun(runs[0], false);
  EXPECT_EQ(done.job, "tiny");
  EXPECT_EQ(done.state, "completed");
  EXPECT_EQ(done.step, 24);
  EXPECT_EQ(done.best, "top1 0.6100");
  EXPECT_EQ(done.seconds, 75);
  // Its log was just written: running; the newest committed checkpoint is 20.
  const RunInfo live = describeRun(runs[1], false);
  EXPECT_EQ(live.state, "running");
  EXPECT_EQ(live.step, 20);
  EXPECT_EQ(live.checkpointStep, 20);
  // An hour later with no change: interrupted (it can resume).
  const auto old = std::filesystem::file_time_type::clock::now() - std::chrono::hours(1);
  std::filesystem::last_write_time(runs[1] + "/logs/rank-0.log", old);
  EXPECT_EQ(describeRun(runs[1], false).state, "interrupted");
  std::ostringstream out;
  EXPECT_EQ(printRuns(dir.path(), out, false), 0);
  EXPECT_TRUE(has(out.str(), "sweep/0-lr=0.1")) << out.str();
  EXPECT_TRUE(has(out.str(), "1m15s")) << out.str();
  EXPECT_THROW(findRuns(dir.file("missing")), DataError);
}

TEST(SlurmEnvironment, RankZerosAddressAndTheTasksCpus) {
  ::setenv("SLURM_PROCID", "1", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3", 1);
  ::setenv("SLURM_CPUS_PER_TASK", "3", 1);
  auto r = env::detectRankEnv();
  EXPECT_EQ(r.masterAddr, "10.1.2.3");
  EXPECT_FALSE(env::slurmCpusPerTask());  // the batch script, not a task of a step
  ::setenv("SLURM_STEP_ID", "0", 1);
  EXPECT_EQ(env::slurmCpusPerTask(), 3);
  ::setenv("MASTER_ADDR", "10.9.9.9", 1);
  EXPECT_EQ(env::detectRankEnv().masterAddr, "10.9.9.9");
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_CPUS_PER_TASK",
                        "SLURM_STEP_ID", "MASTER_ADDR"}) {
    ::unsetenv(v);
  }
}

}  // namespace
}  // namespace cohort::cluster
