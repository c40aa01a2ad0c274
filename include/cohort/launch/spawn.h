#pragma once

// Starting rank processes: what `cohort run` and `cohort health` share.

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "cohort/config/load.h"
#include "cohort/core/env.h"

namespace cohort::launch {

// The environment block of one rank, built before fork (the child only calls
// async-signal-safe functions until exec): this process's environment
// without other launchers' rank variables, plus the rank's place
// (env::rankVariables), the store token, the job's URL credentials,
// COHORT_RESTART_COUNT and `extra`.
std::vector<std::string> rankEnvironment(const env::RankEnv& r, int restartCount,
                                         const UrlCredentials& credentials,
                                         const std::string& storeToken,
                                         const std::vector<std::pair<std::string, std::string>>& extra);

// The path of the running cohort binary (/proc/self/exe). Throws Error.
std::string selfExecutable();

// The program that runs the commands needing LibTorch (ranks among them),
// which the front end `cohort` hands them to (cli/common.h).
inline constexpr const char* kEngineProgram = "cohort-torch";

// The path of kEngineProgram: this binary when it is that program, the one
// beside it when there is one, else this binary (a C++ program linking
// libcohort that runs its own ranks). Throws Error.
std::string engineExecutable();

// "exited with code 3", "was killed by signal 9 (SIGKILL)": a wait status.
std::string describeStatus(int status);

// Forks and execs `exe` with `args` (argv[0] included). The child dies with
// this process (PR_SET_PDEATHSIG), takes SIGINT and SIGTERM by default again,
// and gets `mask` as its signal mask (nullptr: this process's) and `env` as
// its environment (nullptr: this process's). Everything is built before
// fork: the child only calls async-signal-safe functions until exec, and
// exits 127 naming `what` if exec fails. Throws Error when fork fails.
pid_t spawn(const std::string& exe, const std::vector<std::string>& args,
            const std::vector<std::string>* env, const sigset_t* mask, const char* what);

}  // namespace cohort::launch
