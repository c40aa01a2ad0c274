#pragma once

// A real Slurm for the tests (Debian's slurmctld, slurmd and munge): a
// throw-away slurm.conf in a temporary directory, munged with its own key
// and socket, slurmctld and one slurmd per node on ports it picks. One node
// runs on loopback; several run one slurmd each in a network namespace of
// their own (util/netns.h), so srun crosses a network. Everything runs as
// root (proctrack/linuxproc, task/none, no accounting database). The
// destructor cancels every job, stops the daemons and ends every process
// the cluster started (they carry a marker in their environment), so a test
// leaves nothing behind.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "util/netns.h"
#include "util/process.h"

namespace cohort::test {

class SlurmCluster {
 public:
  // Empty when a cluster can run here, else why not (for GTEST_SKIP).
  static std::string unavailable(int nodes);

  // `nodes` slurmd, named n1..nN, each with this machine's CPUs. Waits (at
  // most 60 s) until every node is idle; throws std::runtime_error with the
  // daemons' logs otherwise.
  explicit SlurmCluster(int nodes = 1, const std::string& extraConf = "");
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // What a Slurm client (and `cohort submit`) needs in its environment.
  std::map<std::string, std::string> env() const;
  // Runs a Slurm client (sbatch, squeue, scontrol, ...) against this cluster.
  ProcessResult client(const std::vector<std::string>& argv) const;
  // `scontrol -o show job ID`: one line of KEY=value fields ("" if unknown).
  std::string showJob(const std::string& id) const;
  // A field of showJob ("JobState", "ExitCode", "Restarts"); "" if absent.
  std::string jobField(const std::string& id, const std::string& key) const;
  std::string node(int i) const { return "n" + std::to_string(i + 1); }
  // Node i's address (its network namespace's; 127.0.0.1 for one node).
  std::string address(int i) const { return net_ ? net_->address(i) : "127.0.0.1"; }
  // Whether process `pid` runs on node i: in the network namespace of its
  // slurmd.
  bool runsOn(pid_t pid, int i) const;
  std::string conf() const { return dir_.file("slurm.conf"); }
  std::string logs() const;  // the daemons' logs, for failure messages

 private:
  void start(const std::string& extraConf);
  void stop();
  TempDir dir_;
  int nodes_;
  std::string marker_;
  std::unique_ptr<TestNetwork> net_;
  std::unique_ptr<Process> munged_, ctld_;
  std::vector<std::unique_ptr<Process>> slurmds_;
};

}  // namespace cohort::test
