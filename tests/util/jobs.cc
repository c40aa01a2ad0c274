#include "util/jobs.h"

#include <chrono>
#include <thread>
#include <filesystem>
#include <fstream>

#include "test_paths.h"

namespace cohort::test {

std::string cohortBin() { return COHORT_BIN; }
std::string sourceDir() { return COHORT_SOURCE_DIR; }
std::string fashionMnistDir() { return "/usr/share/datasets/fashion-mnist"; }

ProcessResult cohort(const std::vector<std::string>& args,
                     const std::map<std::string, std::string>& env,
                     std::chrono::milliseconds limit) {
  std::vector<std::string> argv{cohortBin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, env, limit);
}

std::string tinyJobYaml(const std::string& name) {
  return "name: " + name + R"(
model:
  arch: simple_cnn
  num_classes: 4
  width: 4
  hidden: 16
  batch_norm: false
  dropout: 0.0
  memory_format: channels_last  # fixed: runs compared by their weights take the same kernels
data:
  train:
    kind: synthetic
    size: 96
    shape: [1, 8, 8]
    seed: 3
  loader_threads: 1
distribution:
  procs_per_node: 1
  threads_per_rank: 1
  timeout_s: 60
training:
  epochs: 1
  batch_size: 8
  seed: 7
  log_every: 1
  optimizer:
    name: sgd
    lr: 0.05
    momentum: 0.9
    weight_decay: 0.0001
output:
  progress: off
)";
}

std::vector<nlohmann::json> readJsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

std::vector<std::unique_ptr<Process>> startWorkers(
    const std::string& job, const std::string& runDir, int world,
    const std::function<std::vector<std::string>(int)>& argsOf,
    const std::map<std::string, std::string>& env, const WrapRank& wrap) {
  const std::string port = std::to_string(freePort());
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args{cohortBin(), "worker", job, "--run-dir", runDir};
    for (auto& a : argsOf(r)) args.push_back(a);
    std::map<std::string, std::string> vars = env;
    vars["RANK"] = std::to_string(r);
    vars["WORLD_SIZE"] = std::to_string(world);
    vars.emplace("MASTER_ADDR", "127.0.0.1");  // unless `env` names one
    vars["MASTER_PORT"] = port;
    ranks.push_back(std::make_unique<Process>(wrap ? wrap(r, args) : args, vars));
  }
  return ranks;
}


int waitForPortFile(const std::string& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::error_code ec;
  while (!std::filesystem::exists(path, ec) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!std::filesystem::exists(path, ec)) return -1;
  return std::stoi(readText(path));
}

}  // namespace cohort::test
