#pragma once

// `cohort report RUN`: one self-contained HTML page of a run (no script,
// style or font fetched from anywhere; the plots are inline SVG drawn here).
//
// What it reads from the run directory, each when present:
//   metrics.jsonl          training and evaluation curves, resume records
//   summary.json           state, final figures, memory per rank, the plan
//                          against the run
//   timeline/rank-<r>.json step times and data wait per rank (--timeline),
//                          checkpoint blocking
//   tensorboard/           checkpoint/blocked_ms
//   logs/*.log             per-rank throughput and memory (the ranks' epoch
//                          and memory lines); the launcher's starts, failures
//                          and restarts on the time axis
//   events/agent-*.jsonl   elastic rounds, re-forms, failures, leaves
//   plan.json              a plan to compare with (or --plan FILE)
//   profile/operators-rank-<r>.json  the operator table of a profiled run
// A run still going, or one that ended without summary.json (crashed,
// killed), is drawn from what is there, and the page says so.

#include <ostream>
#include <string>
#include <vector>

namespace cohort::monitor {

struct ReportOptions {
  std::string runDir;
  std::string output;    // the page to write; "" = <runDir>/report.html
  std::string planFile;  // `cohort plan --json` output to compare with; "" = the run's own plan
};

struct ReportResult {
  std::string path;                  // the page written
  std::string state;                 // completed, stopped, running, failed, ended, started
  std::string stateNote;             // why the state was concluded ("" for a completed run)
  std::vector<std::string> plots;    // ids of the plots drawn ("plot-loss", ...)
  std::vector<std::string> missing;  // a line per section left empty, saying why
};

// Reads the run, writes the page (atomically) and returns what it holds.
// Throws DataError (exit 2) naming the path when runDir does not exist or is
// not a run directory (none of job.yaml, logs/, metrics.jsonl in it), or when
// planFile cannot be read as a plan; IoError when the page cannot be written.
ReportResult writeReport(const ReportOptions& options);

// `cohort report`: writes the page and prints its path, the run's state and
// what is missing to `out`. Returns the exit code (0).
int printReport(const ReportOptions& options, std::ostream& out);

}  // namespace cohort::monitor
