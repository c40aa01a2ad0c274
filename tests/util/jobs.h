#pragma once

// Helpers for tests that run the cohort binary on small jobs.

#include <nlohmann/json.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "util/process.h"

namespace cohort::test {

std::string cohortBin();
std::string sourceDir();
std::string fashionMnistDir();  // /usr/share/datasets/fashion-mnist

// Runs `cohort args...`; `limit` only guards against hangs.
ProcessResult cohort(const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env = {},
                     std::chrono::milliseconds limit = std::chrono::minutes(10));

// A small, fast job on synthetic 1x8x8 data with simple_cnn, no BatchNorm,
// no dropout, progress off; `extra` is YAML merged over it through --set
// style keys: pass overrides to the command line instead when possible.
std::string tinyJobYaml(const std::string& name);

// Starts `world` `cohort worker` processes on `job` without a launcher, as
// the environment contract has them (RANK, WORLD_SIZE, MASTER_ADDR and a
// free MASTER_PORT): argsOf(rank) are each rank's further arguments, `env`
// further variables for every rank (MASTER_ADDR among them replaces 127.0.0.1).
// `wrap(rank, argv)`, when given, is the command line that runs it (a
// cgroup of the rank's own: MemoryCgroup::wrap).
using WrapRank = std::function<std::vector<std::string>(int, const std::vector<std::string>&)>;
std::vector<std::unique_ptr<Process>> startWorkers(
    const std::string& job, const std::string& runDir, int world,
    const std::function<std::vector<std::string>(int)>& argsOf,
    const std::map<std::string, std::string>& env = {}, const WrapRank& wrap = {});

// The port a server started with `--port 0 --port-file PATH` listens on,
// once it has written PATH (polled every 20 ms for at most `limit`); -1
// when it has not by then (the server's stderr says why).
int waitForPortFile(const std::string& path, std::chrono::seconds limit = std::chrono::seconds(120));

// Lines of a JSON-lines file.
std::vector<nlohmann::json> readJsonLines(const std::string& path);

}  // namespace cohort::test
