#include "cohort/cluster/slurm.h"

#include <fmt/format.h>
#include <signal.h>

#include <cctype>

#include "cohort/core/env.h"
#include "cohort/core/error.h"
#include "cohort/core/exit_codes.h"

namespace cohort::cluster {

std::string shellQuote(const std::string& word) {
  bool plain = !word.empty();
  for (const char c : word) {
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || std::string("/._-+=:,@%").find(c) != std::string::npos);
  }
  if (plain) return word;
  std::string q = "'";
  for (const char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string parseSubmittedJobId(const std::string& out) {
  std::string line = out.substr(0, out.find('\n'));
  line = line.substr(0, line.find(';'));
  const auto b = line.find_first_not_of(" \t\r");
  const auto e = line.find_last_not_of(" \t\r");
  if (b != std::string::npos) line = line.substr(b, e - b + 1);
  bool digits = !line.empty();
  for (const char c : line) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (!digits) throw Error(fmt::format("sbatch printed no job id: '{}'", out));
  return line;
}

namespace {

// An elastic job's task is the node's agent: its ranks share its CPUs.
int64_t agentCpus(const SlurmRequest& r) { return r.cpusPerTask * r.tasksPerNode; }

// Stopping: Slurm's warning before the time limit comes to the script
// (--signal=B:USR2@S), which passes it to the step that runs, or, when none
// does, stops before the next one; and a step's end by a stop (75, or the
// warning's own signal) is a stop, not a crash: back into the queue.
std::string stopHandling() {
  return fmt::format(
      "\n# Slurm's warning before the time limit comes to this script (--signal=B:USR2@S),\n"
      "# which passes it to the step that runs: srun forwards it to every task, which\n"
      "# finishes its step, writes a checkpoint and exits {0}. One that comes while no\n"
      "# step runs stops the job before the next one starts: nothing new to save.\n"
      "stop=0\n"
      "step=\n"
      "trap 'stop=1; [ -z \"$step\" ] || kill -USR2 \"$step\" 2> /dev/null' USR2\n"
      "# run_step COMMAND...: one srun, in the background so that the trap runs at\n"
      "# once, waited for until it has ended (a trapped signal ends `wait` early).\n"
      "# Sets $code.\n"
      "run_step() {{\n"
      "  \"$@\" &\n"
      "  step=$!\n"
      "  wait \"$step\"\n"
      "  code=$?\n"
      "  while kill -0 \"$step\" 2> /dev/null; do\n"
      "    wait \"$step\"\n"
      "    code=$?\n"
      "  done\n"
      "  step=\n"
      "}}\n"
      "# stopped WHY: stopped after a checkpoint, or with nothing newer than the last\n"
      "# one (time limit, preemption, scancel --signal=USR2). Back into the queue when\n"
      "# asked for: the next start resumes from the newest checkpoint.\n"
      "stopped() {{\n"
      "  echo \"cohort: $1\"\n"
      "  if [ \"$requeue\" = 1 ]; then\n"
      "    if command -v scontrol > /dev/null; then\n"
      "      echo \"cohort: requeueing Slurm job $SLURM_JOB_ID\"\n"
      "      scontrol requeue \"$SLURM_JOB_ID\"\n"
      "    else\n"
      "      echo \"cohort: no scontrol on this node: the job is requeued only where slurm.conf \"\\\n"
      "           \"has RequeueExit={0} (or resubmit this script)\"\n"
      "    fi\n"
      "  fi\n"
      "  exit {0}\n"
      "}}\n"
      "# srun's exit code when a task died of the warning itself (128 + SIGUSR2).\n"
      "warning_death={1}\n",
      kExitStoppedAfterCheckpoint, 128 + SIGUSR2);
}

// After a step: a stop (75, a death by the warning, or any end once the
// warning came) keeps the newest checkpoint and goes back into the queue.
std::string stoppedCases() {
  return fmt::format(
      "    {0}) stopped \"stopped after a checkpoint\" ;;\n"
      "    $warning_death) stopped \"a task ended by the time limit's warning: the newest checkpoint is kept\" ;;\n",
      kExitStoppedAfterCheckpoint);
}

// One `cohort worker` per task, started again after a failed attempt.
std::string workerSteps(const SlurmRequest& r) {
  std::string s = "\n# Like `cohort run`: a failed attempt starts every rank again, resuming from\n"
                  "# the newest checkpoint, at most distribution.max_restarts times.\n";
  s += "attempt=0\n";
  s += "while :; do\n";
  s += "  [ \"$stop\" = 0 ] || stopped \"the time limit's warning came while no step ran: nothing new to save\"\n";
  s += "  # Rank 0 hosts the rendezvous store on this node, the first of the\n"
       "  # allocation, where srun runs (the ranks read its address from\n"
       "  # SLURM_LAUNCH_NODE_IPADDR), on a port free here now.\n";
  if (r.masterPort > 0) {
    s += fmt::format("  export MASTER_PORT={}  # distribution.master_port\n", r.masterPort);
  } else {
    s += "  MASTER_PORT=$(\"$cohort\" free-port) || exit 1\n"
         "  export MASTER_PORT\n";
  }
  // --wait: once one task ends, the others get this long to end on their own
  // (a stop after a checkpoint ends every rank within stop_timeout_s).
  std::string srun = "srun --wait=120";
  if (r.cpusPerTask > 0) srun += fmt::format(" --cpus-per-task={}", r.cpusPerTask);
  s += "  run_step " + srun + " \"$cohort\" worker \"$run_dir/job.yaml\" --run-dir \"$run_dir\"\n";
  s += "  case $code in\n"
       "    0) exit 0 ;;\n" +
       stoppedCases() +
       "    2|3|5) exit $code ;;  # bad input, divergence, failed health check: would fail again\n"
       "  esac\n";
  s += "  if [ \"$stop\" = 1 ]; then\n"
       "    stopped \"srun exited $code after the time limit's warning: the newest checkpoint is kept\"\n"
       "  fi\n";
  s += "  if [ \"$attempt\" -ge \"$max_restarts\" ]; then\n"
       "    echo \"cohort: giving up after $attempt restarts (distribution.max_restarts); srun exited $code\"\n"
       "    exit $code\n"
       "  fi\n"
       "  attempt=$((attempt + 1))\n"
       "  echo \"cohort: restart $attempt of at most $max_restarts (srun exited $code)\"\n"
       "  export COHORT_RESTART_COUNT=$attempt\n"
       "done\n";
  return s;
}

// One `cohort agent` per node (elastic training).
std::string agentSteps(const SlurmRequest& r) {
  std::string s =
      "\n# One `cohort agent` per node (elastic training, docs/elastic.md). The agents\n"
      "# form the job from the nodes of this allocation, re-form without a node that\n"
      "# fails (--no-kill keeps the others running), and start failed ranks again\n"
      "# themselves, at most distribution.max_restarts times. SIGUSR2 before the time\n"
      "# limit, and SIGTERM (scancel, preemption), stop the whole job after a checkpoint.\n"
      "# The rendezvous has a name of its own for each start of the job.\n"
      "rdzv_id=\"slurm-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}\"\n";
  const std::string nnodes = fmt::format("{}:{}", r.nodes, r.maxNodes);
  std::string srun = "srun --ntasks-per-node=1 --no-kill --kill-on-bad-exit=0 --wait=0";
  if (r.cpusPerTask > 0) srun += fmt::format(" --cpus-per-task={}", agentCpus(r));
  const std::string agentArgs =
      fmt::format("--nnodes {} --procs {} --on-sigterm stop", nnodes, r.tasksPerNode);
  s += "[ \"$stop\" = 0 ] || stopped \"the time limit's warning came before the agents started: nothing new to save\"\n";
  if (r.rdzv.empty()) {
    s += "# On cohort's store, hosted by the agent on this node (the first of the\n"
         "# allocation, where srun runs) at a port free here now; every agent reads\n"
         "# this node's address from srun (SLURM_LAUNCH_NODE_IPADDR).\n"
         "rdzv_port=$(\"$cohort\" free-port) || exit 1\n";
    s += "run_step " + srun + " \\\n";
    s += "  /bin/sh -c 'exec \"$0\" agent \"$1/job.yaml\" --run-dir \"$1\" " + agentArgs +
         " --rdzv \"store://$SLURM_LAUNCH_NODE_IPADDR:$2/$3\"' \\\n"
         "  \"$cohort\" \"$run_dir\" \"$rdzv_port\" \"$rdzv_id\"\n";
  } else {
    s += "run_step " + srun + " \\\n";
    s += "  \"$cohort\" agent \"$run_dir/job.yaml\" --run-dir \"$run_dir\" " + agentArgs + " --rdzv " +
         shellQuote(r.rdzv) + "/\"$rdzv_id\"\n";
  }
  s += "# An agent lost with its node makes srun fail although the others completed\n"
       "# the job (rank 0 wrote its summary).\n"
       "if [ \"$code\" != 0 ] && [ \"$code\" != 75 ] && [ -f \"$run_dir/summary.json\" ] &&\n"
       "   [[ $(< \"$run_dir/summary.json\") == *'\"status\": \"completed\"'* ]]; then\n"
       "  echo \"cohort: srun exited $code, but the job completed on the others\"\n"
       "  code=0\n"
       "fi\n";
  s += "case $code in\n" + stoppedCases() + "esac\n";
  s += "if [ \"$code\" != 0 ] && [ \"$stop\" = 1 ]; then\n"
       "  stopped \"srun exited $code after the time limit's warning: the newest state is kept\"\n"
       "fi\n";
  s += "exit $code\n";
  return s;
}

}  // namespace

std::string sbatchScript(const SlurmRequest& r) {
  if (r.runDirs.empty()) throw UsageError("a Slurm job needs a run directory");
  if (r.nodes < 1) throw UsageError(fmt::format("--nodes must be >= 1, got {}", r.nodes));
  if (r.tasksPerNode < 1) {
    throw UsageError(fmt::format("distribution.procs_per_node must be >= 1, got {}", r.tasksPerNode));
  }
  const bool elastic = r.maxNodes > 0;
  if (elastic && r.maxNodes < r.nodes) {
    throw UsageError(fmt::format("--nodes {}:{}: MIN must be at most MAX", r.nodes, r.maxNodes));
  }
  const bool array = r.runDirs.size() > 1;
  std::string s = "#!/bin/bash\n";
  s += fmt::format(
      "# Written by `cohort submit --slurm` for job '{}'. Submit it again with `sbatch {}`;\n"
      "# adapt it freely (docs/slurm.md explains every line).\n",
      r.jobName, "<this file>");
  auto opt = [&s](const std::string& line) { s += "#SBATCH " + line + "\n"; };
  opt("--job-name=" + r.jobName);
  if (elastic) {
    if (r.maxNodes > r.nodes) {
      // As many nodes as are free now, up to MAX. No task count: Slurm
      // would then give no more nodes than tasks (srun below runs one per
      // node).
      opt(fmt::format("--nodes={}-{}", r.nodes, r.maxNodes));
      opt("--spread-job");
    } else {
      opt(fmt::format("--nodes={}", r.nodes));
      opt("--ntasks-per-node=1");  // the agent; it starts the node's ranks
    }
    if (r.cpusPerTask > 0) opt(fmt::format("--cpus-per-task={}", agentCpus(r)));
    opt("--no-kill");
  } else {
    opt(fmt::format("--nodes={}", r.nodes));
    opt(fmt::format("--ntasks-per-node={}", r.tasksPerNode));
    if (r.cpusPerTask > 0) opt(fmt::format("--cpus-per-task={}", r.cpusPerTask));
  }
  if (r.gpusPerNode > 0) opt(fmt::format("--gpus-per-node={}", r.gpusPerNode));
  if (!r.partition.empty()) opt("--partition=" + r.partition);
  if (!r.time.empty()) opt("--time=" + r.time);
  if (!r.account.empty()) opt("--account=" + r.account);
  // The warning to this script, which passes it to the step (stopHandling).
  opt(fmt::format("--signal=B:USR2@{}", r.warnSeconds));
  opt(r.requeue ? "--requeue" : "--no-requeue");
  opt("--open-mode=append");
  opt("--output=" + r.outputFile);
  if (array) opt(fmt::format("--array=0-{}", r.runDirs.size() - 1));
  s += "\nset -u\n";
  s += "cohort=" + shellQuote(r.cohortBinary) + "\n";
  if (array) {
    s += "# One run directory per array task: the sweep's points.\n";
    s += "run_dirs=(\n";
    for (const auto& d : r.runDirs) s += "  " + shellQuote(d) + "\n";
    s += ")\n";
    s += "run_dir=${run_dirs[$SLURM_ARRAY_TASK_ID]}\n";
  } else {
    s += "run_dir=" + shellQuote(r.runDirs.front()) + "\n";
  }
  s += "requeue=" + std::string(r.requeue ? "1" : "0") + "\n";
  if (!elastic) {
    s += fmt::format("max_restarts={}  # distribution.max_restarts\n", r.maxRestarts);
    // srun starts the ranks here, not cohort's launcher: the same short spin
    // of idle OpenMP threads it gives them (core/env.h, rankOpenMpWait).
    s += fmt::format(
        "# Idle OpenMP threads spin briefly, then sleep, as under `cohort run`, unless\n"
        "# a wait policy is set (docs/performance.md, \"A busy machine\").\n"
        "if [ -z \"${{OMP_WAIT_POLICY:-}}\" ] && [ -z \"${{GOMP_SPINCOUNT:-}}\" ]; then\n"
        "  export GOMP_SPINCOUNT={}\n"
        "fi\n",
        env::kRankSpinCount);
  }
  for (const auto& [name, value] : r.env) s += "export " + name + "=" + shellQuote(value) + "  # --debug\n";
  s += "echo \"cohort: Slurm job ${SLURM_JOB_ID} (start ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST}: "
       "run directory $run_dir\"\n";
  s += stopHandling();
  s += elastic ? agentSteps(r) : workerSteps(r);
  return s;
}

}  // namespace cohort::cluster
