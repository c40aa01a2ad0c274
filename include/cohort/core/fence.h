#pragma once

// Fencing a lost node's ranks out of the run directory.
//
// Under `cohort agent`, each round of an elastic job has a number. When a
// node is cut off or stopped for longer than elastic.node_timeout_s, the
// others declare it lost and go on without it in a newer round; its ranks
// may still be running, and write again when the partition heals or the
// machine resumes. So the agent that declares node N lost in round R marks
// it in the run directory: <run>/fenced/<R>-<N>, an empty file that is
// never removed. Before each write that changes the run's state (a
// checkpoint's files, its manifest, retention's deletions, a metrics
// record, the final model, the summary) a rank asks the fence: a rank of
// node N in a round at or before R logs that it is fenced, writes nothing
// more, and ends at once with kExitFenced. The state in the node's own
// memory (elastic.state_dir) is not the run's and is not fenced.
//
// A check is a directory listing: cheap, and not atomic with the write that
// follows it. The agent of a fenced node also kills its ranks as soon as it
// learns that the job went on without it (docs/elastic.md). The fence needs
// the run directory to be one directory shared by every node, as the
// elastic job's checkpoints do.

#include <cstdint>
#include <string>

namespace cohort::fence {

// Marks node `node` as lost in round `round` of the run at `runRoot`.
// Throws IoError.
void markLost(const std::string& runRoot, const std::string& node, int64_t round);

// The latest round in which `node` was marked lost there; -1: never.
int64_t lostIn(const std::string& runRoot, const std::string& node);

// This process is a rank of node `node` in round `round` of the run at
// `runRoot` (the worker under an agent, once). Until then, check() never
// fences.
void install(const std::string& runRoot, const std::string& node, int64_t round);

// Whether this process's node was marked lost in its round or later.
bool fenced();

// When fenced(): logs (error) that this rank is fenced and does not write
// `what`, flushes the log and ends the process with kExitFenced. Otherwise
// returns. Safe from any thread.
void check(const std::string& what);

}  // namespace cohort::fence
