#pragma once

// `cohort logs RUN_DIR [--rank r] [--follow]`: the logs of a run, merged.
//
// A run directory holds logs/launcher.log and logs/rank-<r>.log, each line
// starting "YYYY-MM-DD HH:MM:SS.mmm <level> [rank r/n]" (or "[launcher]").
// Lines are printed in time order; equal times keep the launcher first, then
// rank order, then file order. A line without a timestamp (a continuation:
// a multi-line message, a stack trace) stays under the line before it.

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

namespace cohort::monitor {

struct LogsOptions {
  std::string runDir;
  int rank = -1;        // >= 0: only logs/rank-<rank>.log (not even the launcher's); -1: all
  bool follow = false;  // keep printing lines as they are appended, until the run ends
  // How often files are checked for new lines while following.
  std::chrono::milliseconds pollInterval{200};
  // Once the run has ended, lines still arriving are printed until the files
  // have been quiet this long (ranks write their last lines as they exit);
  // at most 10 times this after the end.
  std::chrono::milliseconds settle{1000};

  // Throws UsageError for a rank below -1 or a non-positive interval.
  void validate() const;
};

// Prints the run's log lines to `out`, merged in time order, and returns the
// exit code.
//
// Without `follow`: prints what the files hold and returns 0.
//
// With `follow`: prints what the files hold, then every poll interval the
// complete lines appended since (lines of one poll merged in time order;
// log files that appear later, such as the ranks' when the launcher has just
// started, are picked up). Returns 0 when the run has ended, that is when
//   - summary.json appears, or is rewritten, in the run directory (or was
//     there from the start with status "completed"), or
//   - the launcher's last line says the run is over ("every rank stopped
//     after writing a checkpoint", "interrupted: every rank stopped",
//     "giving up after ...", "...; stopped the other ranks", or any error)
//     and no restart follows it;
// or 128+N when signal N (SIGINT, SIGTERM) arrives first. While following,
// SIGINT and SIGTERM are blocked in the calling thread and waited for between
// polls (sigtimedwait); the caller's mask is restored on return. Other threads
// of the process must block them too (the CLI has none).
//
// Throws DataError (exit 2) naming the path when runDir is missing or is not
// a run directory (neither logs/ nor job.yaml in it), or, without follow,
// when it has no logs (or no log of `rank`); IoError when `out` fails.
int printLogs(const LogsOptions& options, std::ostream& out);

// Merges the texts of several log files, given in priority order for equal
// times, into one text in time order (what printLogs prints for them).
std::string mergeLogs(const std::vector<std::string>& texts);

}  // namespace cohort::monitor
