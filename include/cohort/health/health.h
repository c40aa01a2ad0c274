#pragma once

// Health checks: is each rank's machine fit to train? Every rank measures
//
//   matmul     float32 n x n torch::mm with the rank's intra-op threads: GFLOP/s (best rep)
//   memory     memcpy between two buffers far larger than the caches, with the rank's
//              intra-op threads: GB/s, bytes read + bytes written (STREAM's Copy)
//   disk       writing a new file in a directory (O_DIRECT where the file system takes
//              it, else buffered writes) then fsync, then deleting it: MB/s
//   allreduce  sum-allreduce of a float32 tensor over the process group (Gloo; not the
//              shared-memory path): bus bandwidth algbw * 2(n-1)/n in GB/s, as
//              nccl-tests; skipped with one rank
//
// and compares each with its minimum in HealthConfig (health.* in the job).
// The thresholds catch broken or badly overloaded hardware; they are not
// performance targets. Every rank's report is gathered through the
// rendezvous store, so every rank sees the same table and, when a check
// fails, throws the same error naming each failing rank, host and check.
//
// `cohort health` runs the checks stand-alone on local ranks (healthCommand);
// distribution.preflight runs them before training (preflight).
//
// This header does not include LibTorch.

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cohort/config/job.h"

namespace cohort::comm {
struct Comm;
}

namespace cohort::health {

enum class CheckStatus { pass, fail, skipped };

// "pass" | "fail" | "skipped"
const char* checkStatusName(CheckStatus status);

struct HealthCheck {
  std::string name;        // matmul | memory | disk | allreduce
  std::string unit;        // GFLOP/s | GB/s | MB/s | GB/s
  std::string key;         // the threshold's job key, e.g. health.min_matmul_gflops
  double value = 0;        // measured; 0 when it could not be measured
  double threshold = 0;    // minimum; 0: measured but not enforced
  CheckStatus status = CheckStatus::skipped;
  std::string detail;      // how it was measured, or why it was skipped
  std::string error;       // why it could not be measured (then it failed); empty otherwise
};

struct HealthReport {
  int rank = 0;
  int worldSize = 1;
  std::string host;
  int threads = 1;                  // intra-op threads the rank measured with
  std::vector<HealthCheck> checks;  // matmul, memory, disk, allreduce

  // No check failed (skipped ones do not count).
  bool passed() const;
  // The check called `name`, or nullptr.
  const HealthCheck* find(const std::string& name) const;
};

// --- Single measurements (no thresholds). Each runs repetitions until about
// `seconds` have passed (at least two), except where noted, and throws on
// error.

// Best GFLOP/s (2 n^3 flops per product) of n x n float32 (or bfloat16)
// products with the calling thread's intra-op threads: torch::mm, and in
// float32 also oneDNN's sgemm, which cohort's linear layers run
// (models/linear.h); the better of the two, each timed for `seconds`.
// `library`, when given, is set to the one that reached it: "torch::mm"
// or "oneDNN sgemm".
double measureMatmulGflops(int64_t n, double seconds, bool bfloat16 = false, std::string* library = nullptr);

// Best GB/s of copying `bytes` between two buffers of that size (counting
// bytes read and bytes written). The buffers are touched before timing.
double measureMemoryGbps(size_t bytes, double seconds);

// Writes up to `bytes` to a new file in `dir` in 4 MiB blocks, stopping
// early once `seconds` have passed (after at least one block), fsyncs it and
// deletes it; returns MB/s (10^6 bytes) including the fsync. `method`, when
// given, receives "O_DIRECT" or "buffered". Throws IoError naming the file
// (a directory that does not exist or is not writable, a full disk); the file
// is removed on every path.
double measureDiskWriteMbps(const std::string& dir, size_t bytes, double seconds,
                            std::string* method = nullptr);

struct AllreduceMeasurement {
  double busbwGbps = 0;  // algbw * 2(n-1)/n
  double algbwGbps = 0;  // bytes / seconds per allreduce
  int reps = 0;          // timed allreduces
  int64_t wrongSums = 0; // elements of the first allreduce (of ones) that did not sum to n
};

// Collective: every rank calls it with the same arguments. One allreduce of
// ones over the process group, whose sums are checked, then timed allreduces
// of `bytes` for about `seconds` (the ranks agree on the count through one
// more small allreduce; at least 3). All zero with one rank. Blocks on the
// peers up to comm.timeout per operation; throws CommError when a peer fails.
AllreduceMeasurement measureAllreduce(const comm::Comm& comm, size_t bytes, double seconds);

// --- Checks, reports, preflight.

// Runs the four checks on this rank against config's thresholds. Collective
// (barriers between the checks keep the ranks measuring at the same time, as
// they would train): every rank of `comm` must call it. A check that cannot
// be measured (the disk directory is not writable) fails with the reason in
// its detail; it does not throw. A peer failure throws CommError. `diskDir`
// is the directory the disk check writes in (made absolute).
HealthReport runHealthChecks(const comm::Comm& comm, const HealthConfig& config,
                             const std::string& diskDir);

// Collective: every rank's report, in rank order, on every rank, through
// comm.store (keys health/<call>/<rank> under comm.storePrefix; the n-th call
// of each rank pairs with the n-th call of the others). Throws TimeoutError
// naming a rank that did not report within comm.timeout.
std::vector<HealthReport> gatherHealthReports(const comm::Comm& comm, const HealthReport& mine);

// A fixed-column table: one row per rank, one column per check ("45.2 ok",
// "0.3 FAIL", "skipped"), and a row of thresholds. Lines end with '\n'.
std::string formatHealthTable(const std::vector<HealthReport>& reports);

// A JSON array with one object per rank:
//   {"rank", "world_size", "host", "threads", "passed",
//    "checks": {"matmul": {"value", "unit", "threshold", "key", "status", "passed", "detail",
//                          "error"},
//               "memory": ..., "disk": ..., "allreduce": ...}}
std::string healthReportsJson(const std::vector<HealthReport>& reports);

// Empty when no check failed; else one message naming each failing rank,
// its host and check, measured against threshold and the threshold's key
// (or the error, e.g. the unwritable path). The same on every rank.
std::string healthFailures(const std::vector<HealthReport>& reports);

// distribution.preflight. Collective: runs the checks on every rank (the
// disk check in config.diskDir, or else `runDir`), gathers the reports,
// logs the table (rank 0 on the console, every rank in its log) and returns
// the reports. Takes a few seconds. Throws PreflightError (exit code 5) with
// healthFailures(...), identical on every rank, when a check failed;
// CommError/TimeoutError when a peer fails.
std::vector<HealthReport> preflight(const comm::Comm& comm, const HealthConfig& config,
                                    const std::string& runDir);

// --- `cohort health [JOB] [--procs N] [--json] [--set key=value ...]`

struct HealthCommandOptions {
  std::string jobPath;                 // empty: every key at its default
  std::vector<std::string> overrides;  // --set key.path=value
  int procs = 0;                       // ranks; 0: distribution.procs_per_node
  bool json = false;                   // print healthReportsJson instead of the table
  std::string executable;              // cohort binary for the ranks; empty: this one
  // Set only in the rank processes the command starts (hidden options).
  int rank = -1;
  int storePort = 0;
};

// Loads the job (a bad job or override throws ConfigError before anything
// starts), hosts a rendezvous store on 127.0.0.1 (a free port), starts
// `procs` rank processes of `executable` (`cohort health ... --rank R
// --store-port P`), and waits for them. Rank 0 prints the table or the JSON
// to its stdout (the command's) and logs the failures. Returns 0 when every
// check of every rank passed, 1 when one failed or a rank ended abnormally
// (named; the others are then killed). The disk check writes in health.disk_dir
// or else output.dir (created if missing). Ranks die with the command
// (PR_SET_PDEATHSIG) and each is bounded by distribution.timeout_s.
int healthCommand(const HealthCommandOptions& options);

// The body of one rank process started by healthCommand (options.rank >= 0):
// connects, runs the checks, gathers, rank 0 prints to `out`; ends the
// process with std::_Exit after flushing, as `cohort worker` does: 0 every
// check passed, 1 a check failed (rank 0 logs healthFailures), 2 bad input,
// 4 any other error (logged by the rank).
[[noreturn]] void runHealthRankAndExit(const HealthCommandOptions& options, std::ostream& out);

}  // namespace cohort::health
