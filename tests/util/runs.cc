#include "util/runs.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "util/jobs.h"

namespace cohort::test {

ProcessResult runJob(const TempDir& dir, const std::string& tag, const std::string& yaml, int procs,
                     const std::vector<std::string>& overrides,
                     const std::map<std::string, std::string>& env,
                     const std::vector<std::string>& extra) {
  const std::string job = dir.file(tag + ".yaml");
  writeText(job, yaml);
  std::vector<std::string> args{"run", job, "--procs", std::to_string(procs), "--run-dir",
                                dir.file(tag)};
  for (const auto& o : overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return cohort(args, env);
}

std::string tinyTokenJobYaml(const std::string& name, const std::string& tokens, const std::string& model) {
  return "name: " + name + "\nmodel: " + model + R"(
data:
  train: {kind: tokens, path: )" + tokens + R"(}
  loader_threads: 1
distribution: {procs_per_node: 1, threads_per_rank: 1, timeout_s: 60}
training:
  epochs: 1
  max_steps: 6
  seed: 7
  log_every: 1
  optimizer: {name: adamw, lr: 0.01, weight_decay: 0.01}
output: {progress: off}
)";
}

std::string tinyGptYaml(const std::string& name, const std::string& tokens, int layers) {
  return tinyTokenJobYaml(name, tokens,
                          "{arch: gpt, n_layer: " + std::to_string(layers) + ", n_head: 2, n_embd: 10, block_size: 12}");
}

std::map<std::string, at::Tensor> tensorsByName(const torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : ckpt::stateDict(model)) out.emplace(name, t);
  return out;
}

ckpt::StateDict trainTiny(const TempDir& dir, const std::string& tag, int procs,
                          const std::vector<std::string>& overrides,
                          const std::map<std::string, std::string>& env) {
  auto r = runJob(dir, tag, tinyJobYaml(tag), procs, overrides, env);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
}

at::Tensor tensorNamed(const ckpt::StateDict& d, const std::string& name) {
  for (const auto& [n, t] : d) {
    if (n == name) return t;
  }
  return {};
}

double maxDifference(const ckpt::StateDict& a, const ckpt::StateDict& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
    EXPECT_EQ(a[k].first, b[k].first);
    // Tensors of other shapes would broadcast into a small difference.
    if (a[k].second.sizes() != b[k].second.sizes()) {
      ADD_FAILURE() << a[k].first << ": shape " << a[k].second.sizes() << " against " << b[k].second.sizes();
      return std::numeric_limits<double>::infinity();
    }
    m = std::max(m, (a[k].second.to(torch::kDouble) - b[k].second.to(torch::kDouble))
                        .abs()
                        .max()
                        .item<double>());
  }
  return m;
}

}  // namespace cohort::test
