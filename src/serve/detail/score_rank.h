#pragma once

// One rank of `cohort score` (`cohort score ... --rank r`, started by the
// command): scores its part of the samples (OUT.run/score.json) in batches
// and appends each batch's lines to OUT.run/part-<r>.jsonl, after the
// complete lines an earlier run left there.

#include "cohort/serve/score.h"

namespace cohort::serve::detail {

// Logs to OUT.run/rank-<r>.log (stderr too goes there), scores, and exits:
// 0 done, 2 bad input (unreadable data, the record does not match), 1 any
// other failure. COHORT_FAULT (core/env.h), a test hook: "kill@rank1:step2"
// kills rank 1 after its second batch, "exit<code>@..." makes it exit.
[[noreturn]] void runScoreRankAndExit(const ScoreOptions& options);

}  // namespace cohort::serve::detail
