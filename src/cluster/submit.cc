#include "cohort/cluster/submit.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>

#include "cohort/cluster/command.h"
#include "cohort/cluster/k8s.h"
#include "cohort/cluster/record.h"
#include "cohort/cluster/slurm.h"
#include "cohort/cluster/sweep.h"
#include "cohort/comm/store.h"
#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "cohort/core/file.h"
#include "cohort/core/run_dir.h"
#include "cohort/core/text.h"
#include "cohort/core/time.h"
#include "cohort/launch/spawn.h"

namespace fs = std::filesystem;

namespace cohort::cluster {
namespace {

// Directories made for a submission, removed unless it went through.
class Made {
 public:
  ~Made() {
    if (kept_) return;
    std::error_code ec;
    for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) fs::remove_all(*it, ec);
  }
  void add(const std::string& dir) { dirs_.push_back(dir); }
  void keep() { kept_ = true; }

 private:
  std::vector<std::string> dirs_;
  bool kept_ = false;
};

// The directory `path` names, created; registered for removal when this call
// made it.
std::string makeDir(const std::string& path, Made& made) {
  const std::string abs = fs::absolute(path).lexically_normal().string();
  std::error_code ec;
  if (!fs::exists(abs, ec)) made.add(abs);
  fs::create_directories(abs, ec);
  if (ec) throw IoError(fmt::format("cannot create directory {}: {}", abs, ec.message()));
  return abs;
}

// The store token every rank of the job proves: a file of the run's, unless
// the job names one.
void giveStoreToken(JobConfig& job, const std::string& dir) {
  if (!job.security.storeTokenFile.empty()) return;
  const std::string path = dir + "/store-token";
  writeFileAtomic(path, comm::newStoreToken() + "\n");
  ::chmod(path.c_str(), 0600);
  job.security.storeTokenFile = path;
}

struct Point {
  JobConfig job;
  std::vector<std::string> overrides;  // the point's own
  std::string label;
  std::string runDir;
};

int64_t defaultWarnSeconds(const JobConfig& job) {
  return static_cast<int64_t>(std::ceil(job.distribution.stopTimeoutS)) + 60;
}

}  // namespace

int runSubmit(const SubmitOptions& o, std::ostream& out) {
  // --nodes N, or MIN:MAX for elastic training (agents).
  int64_t nodes = 0, maxNodes = 0;
  const bool elastic = o.nodes.find(':') != std::string::npos;
  if (!o.nodes.empty()) {
    const auto range = parseCountRange(o.nodes);
    if (!range || range->first < 1 || range->second < range->first) {
      throw UsageError(fmt::format("--nodes {}: expected N or MIN:MAX, with 1 <= MIN <= MAX", o.nodes));
    }
    nodes = range->first;
    if (elastic) maxNodes = range->second;
  }
  if (!o.rdzv.empty() && !elastic) {
    throw UsageError("--rdzv is for elastic training: give --nodes MIN:MAX too");
  }
  if (!o.rdzv.empty() && o.rdzv.rfind("etcd://", 0) != 0 && o.rdzv.rfind("etcds://", 0) != 0) {
    throw UsageError(fmt::format("--rdzv {}: expected etcd://HOST:PORT[,HOST:PORT...] or etcds://... "
                                 "(TLS; the job id is added per start; without --rdzv the first "
                                 "node's agent hosts it)",
                                 o.rdzv));
  }
  if (o.gpusPerNode < 0) throw UsageError(fmt::format("--gpus-per-node must be >= 0, got {}", o.gpusPerNode));
  if (o.warnSeconds < 0) throw UsageError(fmt::format("--signal-seconds must be >= 0, got {}", o.warnSeconds));
  // Every point is checked before anything is made or submitted.
  const auto points = sweepPoints(parseSweeps(o.sweeps));
  std::vector<Point> jobs;
  for (const auto& p : points) {
    std::vector<std::string> overrides = o.overrides;
    overrides.insert(overrides.end(), p.overrides.begin(), p.overrides.end());
    Point q{loadJob(o.jobPath, overrides), p.overrides, p.label, ""};
    if (nodes > 0) q.job.distribution.nodes = nodes;
    checkRanks(q.job, requestedWorldSize(q.job));
    jobs.push_back(std::move(q));
  }
  const JobConfig& first = jobs.front().job;
  const bool sweep = jobs.size() > 1;
  if (o.scheduler == Scheduler::k8s && sweep) {
    throw UsageError("--sweep submits a Slurm job array; with --k8s, write one manifest per point");
  }
  if (o.scheduler == Scheduler::k8s && elastic) {
    throw UsageError("--nodes MIN:MAX (elastic agents) is for --slurm; --k8s takes --nodes N");
  }
  std::string sbatch;
  if (o.scheduler == Scheduler::slurm && !o.dryRun) {
    const auto found = findOnPath("sbatch");
    if (!found) {
      throw UsageError("sbatch is not on PATH: submit from a Slurm login node, or use --dry-run to "
                       "write the script only");
    }
    sbatch = *found;
  }

  Made made;
  std::string top;  // the run directory, or the sweep's
  if (!o.runDir.empty()) {
    top = makeDir(o.runDir, made);
  } else {
    top = createStampedDir(first.output.dir, sweep ? first.name + "-sweep" : first.name);
    made.add(top);
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    Point& p = jobs[i];
    p.runDir = sweep ? makeDir(fmt::format("{}/{}-{}", top, i, p.label), made) : top;
    openRunDir(p.runDir);
    giveStoreToken(p.job, p.runDir);
    writeFileAtomic(p.runDir + "/job.yaml", toYaml(p.job));
  }
  const std::string exe = o.executable.empty() ? launch::selfExecutable() : fs::absolute(o.executable).string();

  if (o.scheduler == Scheduler::k8s) {
    K8sRequest k;
    k.name = first.name;
    k.image = o.image;
    k.ranks = requestedWorldSize(first);
    k.cpusPerRank = first.distribution.threadsPerRank;
    k.gpusPerRank = o.gpusPerNode > 0 ? std::max<int64_t>(1, o.gpusPerNode / first.distribution.procsPerNode) : 0;
    k.masterPort = first.distribution.masterPort > 0 ? first.distribution.masterPort : 29500;
    k.backoffLimit = first.distribution.maxRestarts;
    k.runDir = top;
    k.env = launch::debugEnvironment(o.debug, static_cast<int>(k.ranks), false);
    const std::string manifest = k8sManifest(k);
    writeFileAtomic(top + "/k8s.yaml", manifest);
    made.keep();
    out << manifest;
    out << fmt::format("# written to {}/k8s.yaml; apply it with `kubectl apply -f {}/k8s.yaml`\n", top, top);
    return 0;
  }

  SlurmRequest r;
  r.jobName = first.name;
  r.nodes = first.distribution.nodes;
  r.maxNodes = maxNodes;
  r.rdzv = o.rdzv;
  r.tasksPerNode = first.distribution.procsPerNode;
  r.cpusPerTask = first.distribution.threadsPerRank;
  r.gpusPerNode = o.gpusPerNode;
  r.partition = o.partition;
  r.time = o.time;
  r.account = o.account;
  r.requeue = o.requeue;
  r.warnSeconds = o.warnSeconds > 0 ? o.warnSeconds : defaultWarnSeconds(first);
  r.masterPort = first.distribution.masterPort;
  r.maxRestarts = first.distribution.maxRestarts;
  r.cohortBinary = exe;
  r.env = launch::debugEnvironment(
      o.debug, static_cast<int>(maxNodes > 0 ? maxNodes * first.distribution.procsPerNode : requestedWorldSize(first)),
      false);
  for (const auto& p : jobs) r.runDirs.push_back(p.runDir);
  r.outputFile = top + (sweep ? "/slurm-%A_%a.out" : "/slurm-%j.out");
  const std::string script = top + "/submit.sbatch";
  writeFileAtomic(script, sbatchScript(r));
  ::chmod(script.c_str(), 0755);

  if (o.dryRun) {
    made.keep();
    out << fmt::format("wrote {} (not submitted: --dry-run); submit it with `sbatch {}`\n", script, script);
    return 0;
  }
  const CommandResult res = runCommand({sbatch, "--parsable", script});
  if (res.exitCode != 0) {
    throw UsageError(fmt::format("Slurm refused the job ({}); nothing was submitted",
                                 res.describe("sbatch")));
  }
  const std::string jobId = parseSubmittedJobId(res.out);
  made.keep();
  const std::string submitted = utcNow();
  for (size_t i = 0; i < jobs.size(); ++i) {
    SlurmRecord rec;
    rec.jobId = jobId;
    rec.arrayTask = sweep ? static_cast<int>(i) : -1;
    rec.script = script;
    rec.submitted = submitted;
    rec.overrides = jobs[i].overrides;
    writeSlurmRecord(jobs[i].runDir, rec);
  }
  if (sweep) {
    SlurmRecord rec{jobId, -1, script, submitted, {}};
    writeSlurmRecord(top, rec);
    out << fmt::format("submitted Slurm job array {} ({} points)\n", jobId, jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      out << fmt::format("  {}_{}  {}  {}\n", jobId, i, jobs[i].label, jobs[i].runDir);
    }
    out << fmt::format("sweep directory {}\n`cohort runs {}` lists the points\n", top, top);
  } else {
    out << fmt::format("submitted Slurm job {}\nrun directory {}\n", jobId, top);
    out << fmt::format("`cohort status {0}`, `cohort logs {0} --follow`, `cohort cancel {0}`\n", top);
  }
  return 0;
}

}  // namespace cohort::cluster
