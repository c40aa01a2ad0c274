#pragma once

// Runs as a user keeps track of them, local or on Slurm:
//
//   cohort runs DIR      every run under DIR (a run directory, a sweep's
//                        directory, output.dir): state, step, best metric,
//                        throughput, time, and its report page (the path of
//                        report.html, or the `cohort report` that writes it)
//   cohort status RUN    one run, with its Slurm job's state when submitted
//   cohort cancel RUN    scancel its Slurm job (the ranks checkpoint and stop)
//
// A run's state comes from its summary.json (completed, stopped), else from
// Slurm (slurm.json: squeue, then sacct, then scontrol), else from its logs:
// running while a log changed in the last minute, interrupted (a checkpoint to
// resume from) or failed otherwise.

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace cohort::cluster {

// What Slurm says of a job, through its clients.
struct SlurmState {
  std::string state;   // "PENDING", "RUNNING", "COMPLETED", ...; empty: Slurm no longer knows it
  std::string reason;  // why pending (squeue %r), or the exit code
  std::string elapsed;
  std::string from;    // "squeue", "sacct", "scontrol"
};
// Asks squeue, then sacct, then scontrol about `ref` ("1234", "1234_2"),
// each bounded to 10 s; clients not installed are skipped.
SlurmState querySlurm(const std::string& ref);

struct RunInfo {
  std::string path;
  std::string job;              // the job's name
  std::string state;            // see above
  int64_t step = -1;            // the last step recorded; -1: none
  std::string best;             // "top1 0.874", "eval loss 2.31", "loss 0.42"; "" none
  double seconds = -1;          // wall time of a finished run; -1: unknown
  double samplesPerS = -1;      // training samples per second: the run's (summary.json), else the last record's
  bool hasReport = false;       // <path>/report.html exists (`cohort report`)
  int64_t checkpointStep = -1;  // the newest committed checkpoint
  std::string slurmRef;         // "" when not submitted to Slurm
  SlurmState slurm;
  std::vector<std::string> overrides;  // a sweep point's
};

// `askSlurm`: query Slurm for a submitted run (false: its files only).
RunInfo describeRun(const std::string& runDir, bool askSlurm = true);

// The run directories at `dir`: itself when it is one (job.yaml and logs/),
// else those among its children and grandchildren (a sweep under output.dir),
// by name. Throws DataError when `dir` does not exist.
std::vector<std::string> findRuns(const std::string& dir);

// `cohort runs DIR`: a table, one run a line. Returns the exit code.
int printRuns(const std::string& dir, std::ostream& out, bool askSlurm = true);
// `cohort status RUN`; RUN may be a sweep's directory (every point).
int printStatus(const std::string& runDir, std::ostream& out);
// `cohort cancel RUN`. Throws UsageError when RUN was not submitted to Slurm
// or scancel fails.
int cancelRun(const std::string& runDir, std::ostream& out);

}  // namespace cohort::cluster
