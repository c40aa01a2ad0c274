#pragma once

// A test of whole jobs (`cohort run` with real processes) in one temporary
// directory: each run under its tag, its final model, its logs and its
// summary.json (pipeline_test.cc, tensor_job_test.cc).

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"

namespace cohort::test {

class JobRuns : public ::testing::Test {
 protected:
  // `yaml` run into dir/<tag> on `procs` ranks with training.batch_size
  // `batch` and `kv` (each --set). Records a failure unless it exits
  // `exitCode`; returns model/final.pt when it exited 0, else nothing.
  ckpt::StateDict run(const std::string& tag, const std::string& yaml, int procs, int batch,
                      std::vector<std::string> kv, const std::map<std::string, std::string>& env = {},
                      int exitCode = 0) {
    kv.insert(kv.begin(), "training.batch_size=" + std::to_string(batch));
    last = runJob(dir, tag, yaml, procs, kv, env);
    EXPECT_EQ(last.exitCode, exitCode) << tag << ": " << last.describe();
    if (exitCode != 0 || last.exitCode != 0) return {};
    return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
  }

  // dir/tok/{train,val}: test::corpus(bytes) tokenized by `cohort data
  // tokenize` (the bytes' tokenizer).
  void tokenizeCorpus(size_t bytes = 6'000) {
    writeText(dir.file("corpus.txt"), corpus(bytes));
    auto tok = cohort({"data", "tokenize", dir.file("corpus.txt"), dir.file("tok"), "--no-progress"});
    ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  }

  std::string log(const std::string& tag, int rank) {
    return readText(dir.file(fmt::format("{}/logs/rank-{}.log", tag, rank)));
  }

  nlohmann::json summaryOf(const std::string& tag) {
    return nlohmann::json::parse(readText(dir.file(tag + "/summary.json")));
  }

  TempDir dir;
  ProcessResult last;
};

}  // namespace cohort::test
