// A checkpoint read back in another layout (docs/checkpoint-format.md,
// "Resuming in another layout"), the ways it can be wrong: a slice's file
// that lacks its rows of a tensor, a ZeRO part that is short, and a layout
// that cannot hold the model, each refused with exit 2 and a message that
// names what is wrong. A checkpoint written by an older cohort (a fixture,
// tests/ckpt/fixtures/) resumes in a tensor split and in a pipeline and
// ends where that cohort's own run ended.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <regex>
#include <tuple>
#include <string>
#include <vector>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"
#include "util/job_runs.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

// The first line of `text` that holds `what` (for the record).
std::string lineWith(const std::string& text, const std::string& what) {
  const size_t at = text.find(what);
  if (at == std::string::npos) return "";
  const size_t begin = text.rfind('\n', at), end = text.find('\n', at);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end == std::string::npos ? end : end - begin - 1);
}

class Reshard : public test::JobRuns {
 protected:
  void SetUp() override { tokenizeCorpus(); }

  // The tiny GPT of 4 blocks (test::tinyGptYaml) for 6 steps of batch 8 in
  // all, a checkpoint at step 3 and 6.
  void train(const std::string& tag, int procs, std::vector<std::string> kv) {
    kv.insert(kv.end(), {"checkpoint.every_steps=3", "checkpoint.when_behind=wait"});
    run(tag, test::tinyGptYaml(tag, dir.file("tok/train"), 4), procs, 8 / procs, kv);
  }

  // A copy of `from` whose file `file` holds `edit`'s tensors; the
  // manifest's size and checksum follow, so only the reader can tell.
  std::string editedCopy(const std::string& from, const std::string& to, const std::string& file,
                         const std::function<void(ckpt::StateDict&)>& edit) {
    fs::copy(from, to, fs::copy_options::recursive);
    ckpt::TensorFile f = ckpt::readTensorFile(to + "/" + file);
    edit(f.tensors);
    std::vector<ckpt::TensorRecord> records;
    for (auto& [name, t] : f.tensors) {
      t = t.contiguous();
      records.push_back({name, t.scalar_type(), t.sizes().vec(), t.data_ptr(), static_cast<uint64_t>(t.nbytes())});
    }
    const ckpt::WrittenFile w = ckpt::writeTensorFile(to + "/" + file, records, f.meta);
    ckpt::Manifest m = ckpt::readManifest(to);
    for (auto& mf : m.files) {
      if (mf.name == file) {
        mf.size = w.size;
        mf.checksum = w.checksum;
      }
    }
    ckpt::writeManifest(to, m);
    return to;
  }

  test::ProcessResult resume(const std::string& tag, const std::string& from, int procs, std::vector<std::string> kv) {
    std::vector<std::string> args{"run", dir.file(tag + ".yaml"), "--procs", std::to_string(procs), "--run-dir",
                                  dir.file(tag + "-resumed"), "--resume", from, "--set", "training.max_steps=9"};
    for (const std::string& k : kv) args.insert(args.end(), {"--set", k});
    return test::cohort(args);
  }
};

TEST_F(Reshard, ASliceThatLacksItsRowsOfATensorIsNamedWithTheRows) {
  train("t2", 2, {"distribution.tensor=2"});
  // The second slice's file without its half of the first block's MLP
  // input weight ([40, 10], cut by rows: slice 1 held rows [20, 40)).
  const std::string cut = editedCopy(dir.file("t2/checkpoints/step-6"), dir.file("t2-cut"), "slice1-model.bin",
                                     [](ckpt::StateDict& d) {
                                       for (auto it = d.begin(); it != d.end(); ++it) {
                                         if (it->first == "transformer.h.0.mlp.c_fc.weight") {
                                           d.erase(it);
                                           return;
                                         }
                                       }
                                       ADD_FAILURE() << "no transformer.h.0.mlp.c_fc.weight in slice 1";
                                     });
  const auto r = resume("t2", cut, 1, {"training.batch_size=8", "distribution.tensor=1"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("the checkpoint lacks a region of 'transformer.h.0.mlp.c_fc.weight': tensor slice 1 of 2 "
                       "held rows [20, 40) of its 40 along dimension 0 (missing"),
            std::string::npos)
      << r.err;
  std::printf("%s\n", lineWith(r.err, "lacks a region").c_str());
  // Nothing of it was lost: the checkpoint as written still resumes.
  const auto fine = resume("t2", dir.file("t2/checkpoints/step-6"), 1, {"training.batch_size=8", "distribution.tensor=1"});
  EXPECT_EQ(fine.exitCode, 0) << fine.describe();
}

TEST_F(Reshard, AShortZeroPartIsNamedWithTheElementsOfEachTensorItHeld) {
  train("z1", 2, {"distribution.zero=1"});
  const std::string cut =
      editedCopy(dir.file("z1/checkpoints/step-6"), dir.file("z1-cut"), "optimizer-1.bin", [](ckpt::StateDict& d) {
        for (auto& [name, t] : d) {
          if (name == "part0.exp_avg") t = t.narrow(0, 0, t.size(0) - 7).clone();
        }
      });
  // Restaged into a tensor split: every part is read.
  const auto r = resume("z1", cut, 2, {"training.batch_size=8", "distribution.tensor=2", "distribution.zero=0"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.err.find("the checkpoint lacks a region: 'part0.exp_avg' is of "), std::string::npos) << r.err;
  std::printf("%s\n", lineWith(r.err, "lacks a region").c_str());
  EXPECT_NE(r.err.find(".exp_avg' elements ["), std::string::npos) << r.err;
}

TEST_F(Reshard, EachRankReadsOnlyTheRegionsOfTheTensorsItHolds) {
  train("one", 1, {});
  // (read MB, whole MB) from a rank's log.
  auto readOf = [&](const std::string& tag, int rank) {
    std::smatch m;
    const std::string text = log(tag, rank);
    if (!std::regex_search(text, m, std::regex("restaged: read ([0-9.e+-]+) MB of the checkpoint's model files for this "
                                               "rank's part \\(its whole model: ([0-9.e+-]+) MB\\)"))) {
      ADD_FAILURE() << tag << " rank " << rank << " says nothing of what it read:\n" << text;
      return std::pair<double, double>{0, 0};
    }
    return std::pair<double, double>{std::stod(m[1]), std::stod(m[2])};
  };
  // T = 2: each rank half of every split tensor (the position embedding
  // and the norms whole); between them, every byte.
  const auto t2 = resume("one", dir.file("one/checkpoints/step-3"), 2, {"training.batch_size=8", "distribution.tensor=2"});
  ASSERT_EQ(t2.exitCode, 0) << t2.describe();
  double together = 0;
  for (int r = 0; r < 2; ++r) {
    const auto [read, whole] = readOf("one-resumed", r);
    EXPECT_GT(whole, 0);
    EXPECT_LT(read, 0.6 * whole) << "rank " << r << " read more than its slices";
    together += read;
    RecordProperty(fmt::format("t2_rank{}_read_of_whole", r), fmt::format("{:.3g}", read / whole));
  }
  EXPECT_GE(together, readOf("one-resumed", 0).second * 0.999);
  // From ZeRO stage 3 parts of 2 ranks: each rank of T = 2 reads its rows
  // from the parts that hold them, and ends where the ZeRO run ended.
  train("z3", 2, {"distribution.zero=3"});
  const auto fromParts = resume("z3", dir.file("z3/checkpoints/step-3"), 2,
                                {"training.batch_size=8", "distribution.tensor=2", "distribution.zero=0",
                                 "training.max_steps=6"});
  ASSERT_EQ(fromParts.exitCode, 0) << fromParts.describe();
  for (int r = 0; r < 2; ++r) {
    const auto [read, whole] = readOf("z3-resumed", r);
    EXPECT_LT(read, 0.6 * whole) << "rank " << r << " read more than its slices";
    RecordProperty(fmt::format("zero3_t2_rank{}_read_of_whole", r), fmt::format("{:.3g}", read / whole));
  }
  const double diff = test::maxDifference(ckpt::readStateDict(dir.file("z3/model/final.pt")),
                                          ckpt::readStateDict(dir.file("z3-resumed/model/final.pt")));
  EXPECT_LT(diff, 1e-5);
  RecordProperty("zero3_to_t2_max_difference", fmt::format("{:.3g}", diff));
}

TEST_F(Reshard, ALayoutThatCannotHoldTheModelExits2BeforeReadingTheCheckpoint) {
  // Not a checkpoint at all: a layout check that read it would say so.
  fs::create_directories(dir.file("nothing/step-3"));
  test::writeText(dir.file("nothing/step-3/manifest.json"), "not json");
  test::writeText(dir.file("l.yaml"), test::tinyGptYaml("l", dir.file("tok/train"), 4));
  for (const auto& [procs, key, kv] : std::vector<std::tuple<int, std::string, std::string>>{
           {8, "distribution.pipeline.stages", "distribution.pipeline.stages=8"},
           {3, "distribution.tensor", "distribution.tensor=3"}}) {
    const auto r = test::cohort({"run", dir.file("l.yaml"), "--procs", std::to_string(procs), "--run-dir",
                                 dir.file("l-" + std::to_string(procs)), "--resume", dir.file("nothing/step-3"), "--set",
                                 kv});
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.err.find(key), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("manifest"), std::string::npos) << "read the checkpoint first: " << r.err;
  }
}

TEST_F(Reshard, ACheckpointOfAnOlderCohortResumesInATensorSplitAndInAPipeline) {
  // tests/ckpt/fixtures/README.md: step 3 of 6 of 2 ranks at ZeRO stage 1,
  // written by cohort 650202b, and that run's final model.
  const std::string fixture = dir.file("old");
  fs::create_directories(fixture);
  const auto untar = test::run({"/bin/tar", "-xzf", test::sourceDir() + "/tests/ckpt/fixtures/cohort-650202b-gpt-zero1.tar.gz",
                                "-C", fixture});
  ASSERT_EQ(untar.exitCode, 0) << untar.describe();
  // Its job read the same tokens (test::corpus(6000), the bytes'
  // tokenizer) from where that run kept them: named here instead.
  const std::string was = "/tmp/cohort-old-fixture/tok/train";
  std::string yaml = test::readText(fixture + "/job.yaml");
  yaml.replace(yaml.find(was), was.size(), dir.file("tok/train"));
  test::writeText(dir.file("old.yaml"), yaml);
  ckpt::Manifest m = ckpt::readManifest(fixture + "/step-3");
  std::string job = m.extra["job"].get<std::string>();
  job.replace(job.find(was), was.size(), dir.file("tok/train"));
  m.extra["job"] = job;
  ckpt::writeManifest(fixture + "/step-3", m);
  const ckpt::StateDict old = ckpt::readStateDict(fixture + "/final.pt");
  ASSERT_FALSE(old.empty());
  // The same 8 samples a step: T = 2 (one replica of batch 8), and 2
  // stages of 8 micro-batches of 1.
  for (const auto& [tag, kv] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"old-t2", {"distribution.tensor=2", "distribution.zero=0", "training.batch_size=8"}},
           {"old-p2", {"distribution.pipeline.stages=2", "distribution.pipeline.micro_batches=8", "distribution.zero=0",
                       "training.batch_size=1"}}}) {
    std::vector<std::string> args{"run", dir.file("old.yaml"), "--procs", "2", "--run-dir", dir.file(tag),
                                  "--resume", fixture + "/step-3"};
    for (const std::string& k : kv) args.insert(args.end(), {"--set", k});
    const auto r = test::cohort(args);
    ASSERT_EQ(r.exitCode, 0) << tag << ": " << r.describe();
    EXPECT_NE(log(tag, 0).find("resumed from " + fixture + "/step-3: step 3"), std::string::npos) << log(tag, 0);
    const double diff = test::maxDifference(old, ckpt::readStateDict(dir.file(tag + "/model/final.pt")));
    EXPECT_LT(diff, 1e-5) << tag;
    RecordProperty(tag + "_max_difference", fmt::format("{:.3g}", diff));
  }
}

}  // namespace
}  // namespace cohort
