#pragma once

// Every environment variable cohort reads is read in src/core/env.cc.
//
// A rank learns its place in the job from the environment, as torchrun
// defines it: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT. Ranks started by OpenMPI's mpirun (OMPI_COMM_WORLD_*) or by
// Slurm's srun (SLURM_PROCID, ...) are mapped onto the same contract.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cohort/core/rank_place.h"

namespace cohort::env {

struct RankEnv : RankPlace {
  bool masterFromEnv = false;  // MASTER_ADDR/MASTER_PORT were set
  // Which launcher's variables were found: "torchrun", "openmpi", "slurm",
  // or "none" (a single process: rank 0 of 1).
  std::string source = "none";
  // COHORT_AGENT_STORE=1: a cohort launcher hosts the rendezvous store at
  // MASTER_ADDR:MASTER_PORT; otherwise rank 0 hosts it.
  bool agentStore = false;
};

// Reads the rank's environment. Throws ConfigError naming the variable when a
// value is not a number or is inconsistent (RANK >= WORLD_SIZE, ...).
RankEnv detectRankEnv();

// The variables a cohort launcher sets for one rank (torchrun's names).
std::vector<std::pair<std::string, std::string>> rankVariables(const RankEnv& r);

// COHORT_LOG_LEVEL, if set.
std::optional<std::string> logLevel();

// COHORT_SPM_LIBRARY: where cohort's SentencePiece module is
// (data/tokenizer.cc), when not where the build put it.
std::optional<std::string> sentencePieceLibrary();

// COHORT_FAULT: a fault to inject, for tests of failure handling.
// Syntax "<action>@rank<R>:step<S>[:always]" with action "exit<code>",
// "kill" (SIGKILL to itself), "sleep<seconds>" (the rank hangs after step S),
// "slow<ms>" (every step from S on computes that much longer: a straggler)
// "nan" (the images of step S+1 are NaN), "segv" (SIGSEGV to itself),
// "throw" (an exception ends its training) or "commfail" (step S's last
// collective fails on this rank alone, after it completed on the others, as
// when a peer on another machine is lost mid-collective), e.g.
// "exit3@rank1:step5". It fires
// in the first attempt of a job only (see restartCount), or in every one
// with ":always".
struct Fault {
  enum class Action { exit, kill, sleep, slow, nan, segv, throwError, commFail } action = Action::exit;
  int exitCode = 1;
  int amount = 0;  // sleep: seconds; slow: milliseconds
  int rank = 0;
  long step = 0;
  bool everyAttempt = false;
};
std::optional<Fault> fault();

// COHORT_RESTART_COUNT: restarts of the job so far (a cohort launcher sets it
// for the ranks it starts; 0 when unset). Faults of COHORT_FAULT are injected
// in the first attempt only.
int restartCount();

// COHORT_TEST_CKPT_PAUSE=<step>[:<seconds>]: a test hook; the checkpoint
// writer stops in the middle of writing that step's files, until the
// process is killed (or for that many seconds, then goes on).
struct CheckpointPause {
  long step = 0;
  long seconds = 0;  // 0: until killed
};
std::optional<CheckpointPause> checkpointPause();

// COHORT_TEST_PAUSE=<point>:<dir>: a test hook; a process that reaches
// pause point `point` (pauseForTest) creates <dir>/<point>.<pid> and waits
// there until <dir>/<point>.go exists (at most 120 s), so that a test can
// send a signal at that moment of its life. Points: launcher (`cohort run`
// before its ranks start), agent (`cohort agent` before it takes signals),
// start (a rank before its signal thread), rendezvous (before it connects),
// model (before the model is built), final (after training, before the
// final save).
void pauseForTest(const char* point);

// COHORT_ATTENTION: "matmul" holds causal attention to the product of the
// whole score matrix (models/flash_attention.h), to compare the two; "blas"
// runs the blockwise kernel's float32 blocks through BLAS and the row
// kernels one row at a time, as before 2026-12-07, to compare with its
// per-instruction-set block steps; unset or "auto", the blockwise kernel
// with those steps wherever it applies. Throws ConfigError on another
// value.
bool attentionMatmulOnly();
bool attentionBlasBlocks();

// COHORT_FUSED_OPS: "off" keeps the ATen ops the fused training ops
// replace (models/fused_ops.h), to compare the two; unset or "auto", the
// fused ops run wherever a vector build of their loops does. Throws
// ConfigError on another value.
bool fusedOpsOff();

// COHORT_GEMM: "aten" holds linear layers to LibTorch's product
// (cohort/models/linear.h), to compare the two; "onednn-nt" keeps oneDNN
// but holds every forward product to its (N, T) form, as before
// 2026-12-07 (models/detail/weight_product.h), to compare the forms;
// unset or "auto", CPU float32 linear layers run oneDNN's sgemm. Throws
// ConfigError on another value.
bool linearGemmAten();
bool linearForwardNt();

// ONEDNN_MAX_CPU_ISA (or its older name DNNL_MAX_CPU_ISA): the instruction
// set oneDNN is held to, as set; nullopt when neither is.
std::optional<std::string> onednnMaxIsa();

// Whether onednnMaxIsa() holds oneDNN to an instruction set without bf16
// kernels (SSE41, AVX, AVX2, AVX2_VNNI, any case): LibTorch then fails its
// bf16 products on a CPU with avx512_bf16 unless its oneDNN path is off.
bool onednnHeldBelowBf16();

// ATEN_CPU_CAPABILITY: the instruction set LibTorch's kernels are held to
// ("default", "avx2", "avx512"), lowercased; nullopt when unset. cohort's
// own vector loops follow it (models/fused_kernels.h).
std::optional<std::string> atenCpuCapability();

// The instruction-set holds in effect, "NAME=value" joined by spaces in a
// fixed order (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA,
// OPENBLAS_CORETYPE); "" when none is set. A GEMM ceiling measured under
// one hold is not another's (health/ceiling.h).
std::string instructionSetHolds();

// COHORT_PARSE_ONLY: the command line is parsed and nothing is run (exit 0
// when it parses, 2 naming what is wrong otherwise): how the tests check
// every command line the documentation prints. "partial": a missing
// required argument is not an error (a fragment such as `cohort run
// --procs` in a sentence).
enum class ParseOnly { no, full, partial };
ParseOnly parseOnly();

// COHORT_TEST_SUMMARY_DELAY_MS=<ms>: a test hook; rank 0 waits that long
// after the final barrier before it writes summary.json, so that the other
// ranks (and nodes) end first, as they may when rank 0 is slow to finish.
std::optional<long> summaryDelayMs();

// COHORT_MACHINE_ID: which machine this rank is on, as far as the gradient
// exchange is concerned, instead of its host name and boot id. For
// containers that share a host but not /dev/shm, and for tests that form
// several "machines" on one host. Either one identity, or a comma-separated
// list with one per rank of the job (rank r takes the r-th), so that one
// environment can place every rank. Throws ConfigError when the list has no
// entry for `rank`.
std::optional<std::string> machineId(int rank);

// Set by `cohort agent` for its ranks (docs/elastic.md).
// COHORT_ELASTIC_STATE: this node's directory of training state kept in
// memory between rounds; set means the rank runs elastic.
inline constexpr const char* kElasticStateVar = "COHORT_ELASTIC_STATE";
std::optional<std::string> elasticStateDir();
// COHORT_NODE_ADDRESS: the node's address the other nodes reach (the
// agent's --address); Gloo binds it when distribution.interface is empty.
inline constexpr const char* kNodeAddressVar = "COHORT_NODE_ADDRESS";
std::optional<std::string> nodeAddress();
// COHORT_NODE_ID: the node's id in the rendezvous (the agent's --node-id),
// which the run's fence names when the others declare the node lost
// (cohort/core/fence.h).
inline constexpr const char* kNodeIdVar = "COHORT_NODE_ID";
std::optional<std::string> nodeId();
// Set by cohort's launchers for --debug and --debug-on-failure
// (cohort/launch/debug.h, docs/monitoring.md). COHORT_DEBUG_RANKS: the
// ranks that wait for a debugger before they connect, "1" or "1,3";
// COHORT_DEBUG_ON_FAILURE: the seconds a failed rank waits for one. With
// either set, the rank's timeouts are suspended.
inline constexpr const char* kDebugRanksVar = "COHORT_DEBUG_RANKS";
inline constexpr const char* kDebugOnFailureVar = "COHORT_DEBUG_ON_FAILURE";
std::optional<std::string> debugRanks();
std::optional<int> debugOnFailureSeconds();
// COHORT_TEST_SAMPLE_LOG=<dir>: a test hook; every rank appends the sample
// ids of each optimizer step it applies to <dir>/samples-<pid>.txt.
std::optional<std::string> sampleLogDir();

// Blob storage credentials (see docs/storage.md): AZURE_STORAGE_KEY, an
// account key (base64), and AZURE_STORAGE_SAS_TOKEN, a SAS token (query
// string). Secrets: never log or print them.
std::optional<std::string> azureStorageKey();
std::optional<std::string> azureStorageSasToken();
// AZURE_STORAGE_BEARER_TOKEN: an OAuth bearer token for blob storage.
std::optional<std::string> azureStorageBearerToken();

// COHORT_URL_CREDENTIALS: credentials of the job's URLs (SAS tokens), which
// `cohort run` takes out of job.yaml and hands to its ranks here (see
// takeUrlCredentials in cohort/config/load.h). A secret: never log it.
// COHORT_STORE_TOKEN: the rendezvous store's token (docs/security.md). A
// secret: never log or print it.
inline constexpr const char* kStoreTokenVar = "COHORT_STORE_TOKEN";
std::optional<std::string> storeToken();

// COHORT_SERVE_TOKEN: `cohort serve`'s bearer token when --token-file is not
// given. A secret: never log or print it.
inline constexpr const char* kServeTokenVar = "COHORT_SERVE_TOKEN";
std::optional<std::string> serveToken();

// COHORT_SERVE_RANK_CGROUP: a cgroup directory (with "{rank}" in it) each
// rank of a split model (`cohort serve --procs N`) moves itself into
// before it loads anything, {rank} replaced by its rank: per-rank memory
// limits an operator (or a test) set up beforehand.
inline constexpr const char* kServeRankCgroupVar = "COHORT_SERVE_RANK_CGROUP";
std::optional<std::string> serveRankCgroup();

inline constexpr const char* kUrlCredentialsVar = "COHORT_URL_CREDENTIALS";
std::optional<std::string> urlCredentials();

// Where cohort keeps what it measured of the machine (health/ceiling.h):
// COHORT_CACHE_DIR, else $XDG_CACHE_HOME/cohort, else $HOME/.cache/cohort,
// else /var/tmp/cohort-cache.
inline constexpr const char* kCacheDirVar = "COHORT_CACHE_DIR";
std::string machineCacheDir();

// The variable a job file names (security.encryption.key_env). Its value may
// be a secret: never log it.
std::optional<std::string> namedVariable(const std::string& name);

// Number of CPU cores this process may use (affinity mask), at least 1.
int availableCores();

// How long an idle OpenMP thread of a rank spins before it sleeps. LibTorch's
// intra-op threads wait at the end of each parallel region; GNU OpenMP's
// default spins for about 300,000 rounds first, which on a machine whose
// cores other work also wants keeps a thread on a core its sibling needs:
// measured, one rank of 2 threads fell from thousands of tokens/s to
// hundreds (docs/performance.md, "A busy machine"). cohort's launchers give
// their ranks (and the fork server they fork from: GNU OpenMP reads it as it
// loads) GOMP_SPINCOUNT=kRankSpinCount, unless OMP_WAIT_POLICY or
// GOMP_SPINCOUNT is set already. nullopt then; else the variable to set.
inline constexpr const char* kRankSpinCount = "10000";
std::optional<std::pair<std::string, std::string>> rankOpenMpWait();

// The 1-minute load average (/proc/loadavg); nullopt when unreadable.
std::optional<double> loadAverage();

// A task of an srun step asked for `--cpus-per-task`: SLURM_CPUS_PER_TASK
// when SLURM_STEP_ID is set too (a batch script's own environment has the
// first, not the second). The rank's intra-op threads default to it. Not
// under `cohort agent` (COHORT_ELASTIC_STATE set): there the task is the
// agent, whose CPUs its ranks share.
std::optional<int> slurmCpusPerTask();

// The allocator whose malloc this process calls: "glibc", or "tcmalloc" or
// "jemalloc" when one is preloaded (LD_PRELOAD, as PyTorch's CPU launcher
// does), else "other"; and the file it comes from.
struct MallocInfo {
  std::string name;
  std::string library;
};
MallocInfo servingMalloc();

}  // namespace cohort::env
