#include "util/runs.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "util/jobs.h"

namespace cohort::test {

ckpt::StateDict trainTiny(const TempDir& dir, const std::string& tag, int procs,
                          const std::vector<std::string>& overrides,
                          const std::map<std::string, std::string>& env) {
  const std::string job = dir.file(tag + ".yaml");
  writeText(job, tinyJobYaml(tag));
  std::vector<std::string> args{"run", job, "--procs", std::to_string(procs), "--run-dir",
                                dir.file(tag)};
  for (const auto& o : overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  auto r = cohort(args, env);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
}

double maxDifference(const ckpt::StateDict& a, const ckpt::StateDict& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
    EXPECT_EQ(a[k].first, b[k].first);
    m = std::max(m, (a[k].second.to(torch::kDouble) - b[k].second.to(torch::kDouble))
                        .abs()
                        .max()
                        .item<double>());
  }
  return m;
}

}  // namespace cohort::test
