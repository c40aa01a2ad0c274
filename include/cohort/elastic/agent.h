#pragma once

// `cohort agent JOB.yaml --nnodes MIN:MAX --rdzv URL/JOB_ID`: one per node
// of an elastic job (docs/elastic.md). The agent takes part in rendezvous
// (rendezvous.h), starts the node's ranks for each round with their place
// in it, watches them and the other nodes, and re-forms the job when nodes
// leave or join:
//
//   a node waits to join   the ranks stop at their next step boundary with
//                          the state held in memory (exit 76); a new round
//                          starts with the newcomer, which receives it
//   a node is lost         (its agent's liveness lapsed, or one of its ranks
//                          failed) the survivors stop their ranks and re-form
//                          from the newest state held in any node's memory,
//                          else from the newest checkpoint
//   SIGTERM to the agent   its ranks stop at the next step boundary, the node
//                          leaves; the others re-form without it (exit 0)
//   SIGUSR2 to the agent   the job stops with a checkpoint (Slurm's warning
//                          before the time limit, a preemption): the agent
//                          sends its ranks SIGTERM, every rank of the job
//                          stops at the next step boundary after writing a
//                          checkpoint (exit 75), and the job ends on every
//                          node with 75; a rerun resumes from it. (Held
//                          instead of checkpointed, when checkpoints are off
//                          or a re-form was under way: the agent writes the
//                          newest held state to the checkpoint directory.)
//                          A rank leaves SIGTERM and SIGUSR2 from anyone but
//                          its agent to the agent.
//   fewer than MIN nodes   for elastic.below_min_timeout_s: the newest held
//                          state is written to the checkpoint directory and
//                          the agent exits 75
//
// The job ends when its ranks complete (exit 0 on every node) or fail on
// bad input (2), divergence (3) or a failed preflight check (5); failures
// beyond distribution.max_restarts end it with 1. Membership changes are not
// failures and are not counted.

#include <string>
#include <vector>

#include "cohort/launch/debug.h"

namespace cohort::elastic {

struct AgentOptions {
  std::string jobPath;
  std::vector<std::string> overrides;  // --set key.path=value
  int minNodes = 1;
  int maxNodes = 1;
  std::string rdzv;     // etcd://HOST:PORT[,...]/JOB_ID or store://HOST:PORT/JOB_ID
  std::string nodeId;   // empty: <host name>-<pid>
  std::string address;  // where the other nodes reach this one; empty: found from the rdzv host
  std::string runDir;   // empty: <output.dir>/<name>-<JOB_ID> (on a shared file system)
  int procs = 0;        // > 0 overrides distribution.procs_per_node
  std::string executable;  // cohort binary for the ranks; empty: this one
  // SIGTERM stops the whole job as SIGUSR2 does, instead of this node
  // leaving: under a scheduler that signals every node at once (Slurm's
  // scancel and time limit), nobody would be left to go on.
  bool termStopsJob = false;
  // --debug, --debug-on-failure (launch/debug.h): ranks of the job, checked
  // against MAX nodes x procs; a round without the rank holds none.
  launch::DebugOptions debug;
};

// Returns the exit code (see above). Throws ConfigError for a bad job or
// bad options before joining anything, CommError when the rendezvous
// service stays unreachable.
int runAgent(const AgentOptions& options);

// "etcd://h:p,h:p/job" -> {"etcd://h:p,h:p", "job"}. Throws ConfigError when
// the job id is missing or not made of [A-Za-z0-9._-].
std::pair<std::string, std::string> splitRdzvUrl(const std::string& url);

}  // namespace cohort::elastic
