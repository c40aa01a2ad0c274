// The checkpoint pieces in one process: tensor files, manifests and their
// verification, retention, the asynchronous checkpointer's guarantees, and
// the optimizer state a resumed run needs, and the sealed (encrypted) format
// as an independent writer reads docs/security.md.

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "cohort/ckpt/checkpointer.h"
#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/tensor_file.h"
#include "cohort/config/load.h"
#include "cohort/core/checksum.h"
#include "cohort/core/error.h"
#include "cohort/monitor/metrics.h"
#include "cohort/security/keys.h"
#include "cohort/security/sealed.h"
#include "cohort/train/optimizer.h"
#include "cohort/core/time.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/errors.h"
#include "test_paths.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

void flipByte(const std::string& path, long fromEnd) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(-fromEnd, std::ios::end);
  char c = 0;
  io.read(&c, 1);
  io.seekp(-fromEnd, std::ios::end);
  c = static_cast<char>(c ^ 0x40);
  io.write(&c, 1);
}

// fuzz/corpus/sealed holds files sealed by fuzz/make_sealed_seeds.py (Python's
// cryptography, from the format in docs/security.md): each must open to the
// plaintext that script sealed, so the document and sealed.cc agree.
TEST(SealedFormat, AnIndependentWritersSeedsOpenToTheirPlaintext) {
  const security::Keyring ring{
      security::parseKey("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", "seed key"),
      std::nullopt};
  auto range = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += static_cast<char>(i);
    return s;
  };
  std::string tensors;
  for (int i = 0; i < 4; ++i) tensors += "cohort tensors";
  const std::map<std::string, std::string> expected = {{"empty", ""},
                                                       {"one-chunk", tensors},
                                                       {"three-chunks", range(200)},
                                                       {"exact-chunks", std::string(128, 'x')},
                                                       {"streamed-three-chunks", range(150)}};
  test::TempDir dir;
  fs::create_directories(dir.file("step-1"));
  const std::string path = dir.file("step-1/model.bin");  // the label the seeds were sealed for
  size_t seen = 0;
  for (const auto& e : fs::directory_iterator(std::string(COHORT_SOURCE_DIR) + "/fuzz/corpus/sealed")) {
    const std::string name = e.path().filename().string();
    ASSERT_TRUE(expected.count(name)) << "a seed this test does not know: " << name;
    fs::copy_file(e.path(), path, fs::copy_options::overwrite_existing);
    EXPECT_EQ(security::readSealedFile(path, &ring), expected.at(name)) << name;
    ++seen;
  }
  EXPECT_EQ(seen, expected.size());
}

TEST(TensorFile, RoundTripsEveryTypeAndShape) {
  test::TempDir dir;
  std::vector<at::Tensor> tensors = {torch::randn({3, 4}), torch::arange(7, torch::kInt64),
                                     torch::randn({2, 2}, torch::kFloat64),
                                     torch::randn({5}).to(torch::kHalf),
                                     torch::randn({5}).to(torch::kBFloat16),
                                     torch::tensor({true, false}), torch::empty({0, 3}),
                                     torch::tensor(2.5)};
  std::vector<ckpt::TensorRecord> records;
  for (size_t i = 0; i < tensors.size(); ++i) {
    records.push_back({"t" + std::to_string(i), tensors[i].scalar_type(), tensors[i].sizes().vec(),
                       tensors[i].data_ptr(), static_cast<uint64_t>(tensors[i].nbytes())});
  }
  const std::string path = dir.file("x.bin");
  auto w = ckpt::writeTensorFile(path, records, {{"kind", "test"}});
  EXPECT_EQ(w.size, fs::file_size(path));
  EXPECT_EQ(w.checksum, checksumFile(path));
  auto f = ckpt::readTensorFile(path);
  EXPECT_EQ(f.meta["kind"], "test");
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(f.tensors[i].first, "t" + std::to_string(i));
    EXPECT_EQ(f.tensors[i].second.scalar_type(), tensors[i].scalar_type());
    EXPECT_TRUE(torch::equal(f.tensors[i].second, tensors[i])) << i;
  }
}

TEST(TensorFile, TruncatedOrForeignFilesAreRefusedNamingThem) {
  test::TempDir dir;
  at::Tensor t = torch::randn({1000});
  const std::string path = dir.file("x.bin");
  ckpt::writeTensorFile(path, {{"w", t.scalar_type(), t.sizes().vec(), t.data_ptr(), t.nbytes()}}, {});
  fs::resize_file(path, fs::file_size(path) - 100);
  auto e = test::errorOf<DataError>([&] { ckpt::readTensorFile(path); });
  EXPECT_NE(e.find(path + ": tensor 'w' lies beyond the end of the file"), std::string::npos) << e;
  test::writeText(dir.file("y.bin"), "PK this is something else entirely");
  e = test::errorOf<DataError>([&] { ckpt::readTensorFile(dir.file("y.bin")); });
  EXPECT_NE(e.find("not a cohort tensor file"), std::string::npos) << e;
}

ckpt::Manifest manifestFor(int64_t step) {
  ckpt::Manifest m;
  m.step = step;
  m.epoch = 2;
  m.batchInEpoch = 5;
  m.samplesInEpoch = 80;
  m.worldSize = 2;
  m.jobHash = "abc";
  m.created = utcNow();
  return m;
}

TEST(Manifest, VerificationNamesTheCorruptOrMissingFile) {
  test::TempDir dir;
  at::Tensor t = torch::randn({256});
  const std::string ck = dir.file("step-4");
  fs::create_directories(ck);
  auto w = ckpt::writeTensorFile(ck + "/model.bin",
                                 {{"w", t.scalar_type(), t.sizes().vec(), t.data_ptr(), t.nbytes()}}, {});
  auto m = manifestFor(4);
  m.files.push_back({w.name, w.size, w.checksum, -1});
  ckpt::writeManifest(ck, m);
  auto back = ckpt::readManifest(ck);
  EXPECT_EQ(back.step, 4);
  EXPECT_EQ(back.batchInEpoch, 5);
  EXPECT_EQ(back.files.at(0).checksum, w.checksum);
  EXPECT_TRUE(ckpt::verifyCheckpoint(ck, true).valid);

  flipByte(ck + "/model.bin", 7);
  EXPECT_TRUE(ckpt::verifyCheckpoint(ck, false).valid);  // sizes only
  auto v = ckpt::verifyCheckpoint(ck, true);
  EXPECT_FALSE(v.valid);
  EXPECT_NE(v.problem.find(ck + "/model.bin: checksum"), std::string::npos) << v.problem;

  fs::remove(ck + "/model.bin");
  v = ckpt::verifyCheckpoint(ck, false);
  EXPECT_NE(v.problem.find(ck + "/model.bin: missing"), std::string::npos) << v.problem;

  test::writeText(ck + "/manifest.json", "{\"format\": \"cohort-checkpoint\", \"format_version\": 99}");
  v = ckpt::verifyCheckpoint(ck, false);
  EXPECT_NE(v.problem.find("format version 99"), std::string::npos) << v.problem;
}

TEST(Retention, KeepsTheNewestKAndTheKeepersAndNeverTheNewestValid) {
  std::vector<ckpt::CheckpointDir> dirs;
  for (int64_t s : {100, 200, 300, 400, 500, 600, 700}) dirs.push_back({s, "d" + std::to_string(s)});
  // 700 is in progress (no manifest yet); 600 is the newest valid.
  std::vector<bool> valid = {true, true, true, false, true, true, false};
  auto victims = ckpt::retentionVictims(dirs, valid, 2, 200);
  // Keep 600, 500 (newest two) and 200 (multiple of 200); delete 100, 300,
  // the invalid 400; never touch 700.
  EXPECT_EQ(victims, (std::vector<std::string>{"d400", "d300", "d100"}));
  EXPECT_TRUE(ckpt::retentionVictims(dirs, std::vector<bool>(7, false), 1, 0).empty());
}

// A checkpointer of one rank writing into dir.
ckpt::CheckpointerOptions oneRank(const std::string& dir) {
  ckpt::CheckpointerOptions o;
  o.dir = dir;
  return o;
}

TEST(Checkpointer, SavesTheValuesOfTheMarkedStepEvenIfTheTensorChangesRightAfter) {
  test::TempDir dir;
  at::Tensor weight = torch::full({1 << 16}, 1.0f);
  at::Tensor stat = torch::full({8}, 3.0f);
  {
    ckpt::Checkpointer c(oneRank(dir.path()));
    EXPECT_TRUE(c.mark(manifestFor(1), {{"model.bin", {{"weight", weight, false}, {"stat", stat, true}}, {}}}));
    stat.fill_(-1);  // what a forward does to BatchNorm statistics: mark() copied them
    c.waitCopied();
    weight.fill_(2);  // what the optimizer step does
    c.flush();
    EXPECT_EQ(c.stats().committed, 1);
  }
  auto f = ckpt::readTensorFile(dir.file("step-1/model.bin"));
  EXPECT_TRUE(torch::equal(f.tensors.at(0).second, torch::full({1 << 16}, 1.0f)));
  EXPECT_TRUE(torch::equal(f.tensors.at(1).second, torch::full({8}, 3.0f)));
  EXPECT_TRUE(ckpt::verifyCheckpoint(dir.file("step-1"), true).valid);
}

// In place (no host copy): the same guarantee, as waitCopied() returns
// only once the files are written; a deferred and a non-contiguous tensor
// are written as a copy would write them; a sealed checkpoint too.
TEST(Checkpointer, InPlaceSavesTheMarkedStepsValuesAndWaitsForTheWrite) {
  for (const bool sealed : {false, true}) {
    SCOPED_TRACE(sealed ? "sealed" : "plain");
    test::TempDir dir;
    at::Tensor weight = torch::full({1 << 20}, 1.0f);  // more than the writer's 8 MB buffer
    at::Tensor stat = torch::full({8}, 3.0f);
    const at::Tensor wide = torch::arange(12, torch::kFloat).view({3, 4});
    ckpt::CheckpointerOptions o = oneRank(dir.path());
    o.inPlace = true;
    if (sealed) {
      security::Key key;
      key.bytes.fill(7);
      key.id = std::string(32, 'a');
      o.sealWith = key;
    }
    {
      ckpt::Checkpointer c(o);
      EXPECT_TRUE(c.mark(manifestFor(1), {{"model.bin",
                                            {{"weight", weight, false},
                                             {"stat", stat, true},
                                             {"t", wide.t(), false},
                                             {"made", [] { return torch::full({2}, 5.0f); }}},
                                            {}}}));
      stat.fill_(-1);
      c.waitCopied();
      // Written already: nothing the optimizer step does now can reach it.
      EXPECT_TRUE(fs::exists(dir.file("step-1/model.bin")));
      weight.fill_(2);
      c.flush();
      EXPECT_EQ(c.stats().committed, 1);
    }
    // A sealed file's plaintext is checked by tests/security; here, that
    // it was written whole and is not the plaintext.
    if (sealed) {
      EXPECT_GT(fs::file_size(dir.file("step-1/model.bin")), (1u << 22));
      continue;
    }
    auto f = ckpt::readTensorFile(dir.file("step-1/model.bin"));
    EXPECT_TRUE(torch::equal(f.tensors.at(0).second, torch::full({1 << 20}, 1.0f)));
    EXPECT_TRUE(torch::equal(f.tensors.at(1).second, torch::full({8}, 3.0f)));
    EXPECT_TRUE(torch::equal(f.tensors.at(2).second, wide.t()));
    EXPECT_TRUE(torch::equal(f.tensors.at(3).second, torch::full({2}, 5.0f)));
    EXPECT_TRUE(ckpt::verifyCheckpoint(dir.file("step-1"), true).valid);
  }
}

TEST(Checkpointer, SkipsWhenTheWriterIsBehindAndAppliesRetention) {
  test::TempDir dir;
  at::Tensor w = torch::ones({16});
  auto o = oneRank(dir.path());
  o.keepLast = 2;
  o.pauseAtStep = 1;  // the writer stops in step 1 until the checkpointer is destroyed
  {
    ckpt::Checkpointer c(o);
    EXPECT_TRUE(c.mark(manifestFor(1), {{"model.bin", {{"w", w, false}}, {}}}));
    c.waitCopied();
    EXPECT_FALSE(c.mark(manifestFor(2), {{"model.bin", {{"w", w, false}}, {}}}));
    EXPECT_EQ(c.stats().skipped, 1);
  }
  EXPECT_FALSE(fs::exists(dir.file("step-2")));
  // Without the pause: three commits, the oldest deleted.
  o.pauseAtStep.reset();
  ckpt::Checkpointer c(o);
  for (int64_t s : {3, 4, 5}) {
    c.mark(manifestFor(s), {{"model.bin", {{"w", w, false}}, {}}});
    c.flush();
  }
  EXPECT_FALSE(fs::exists(dir.file("step-3")));
  EXPECT_TRUE(fs::exists(dir.file("step-4/manifest.json")));
  EXPECT_TRUE(fs::exists(dir.file("step-5/manifest.json")));
}

// Rank 0 took step 2 but rank 1's writer was still busy with step 1: the
// step is not committed and counts once, as skipped, on both ranks.
TEST(Checkpointer, AStepAnotherRankSkippedCountsOnceAsSkipped) {
  test::TempDir dir;
  at::Tensor w = torch::ones({16});
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto o0 = oneRank(dir.path());
  o0.worldSize = 2;
  o0.store = store;
  o0.maxInFlight = 2;  // rank 0 has a free buffer for step 2
  auto o1 = o0;
  o1.rank = 1;
  o1.maxInFlight = 1;
  o1.pauseAtStep = 1;  // rank 1's writer holds its one buffer in step 1 a while
  o1.pauseSeconds = 3;
  ckpt::Checkpointer r0(o0);
  ckpt::Checkpointer r1(o1);
  // Each rank writes a file of its own, as training ranks do.
  const auto files = [&](int rank) {
    return std::vector<ckpt::SnapshotFile>{{"rank-" + std::to_string(rank) + ".bin", {{"w", w, false}}, {}}};
  };
  EXPECT_TRUE(r0.mark(manifestFor(1), files(0)));
  EXPECT_TRUE(r1.mark(manifestFor(1), files(1)));
  r1.waitCopied();
  EXPECT_FALSE(r1.mark(manifestFor(2), files(1)));
  EXPECT_TRUE(r0.mark(manifestFor(2), files(0)));
  r1.flush();
  r0.flush();
  EXPECT_EQ(r0.stats().committed, 1);
  EXPECT_EQ(r0.stats().taken, 1);
  EXPECT_EQ(r0.stats().skipped, 1);
  EXPECT_EQ(r1.stats().taken, 1);
  EXPECT_EQ(r1.stats().skipped, 1);
  EXPECT_TRUE(fs::exists(dir.file("step-1/manifest.json")));
  EXPECT_FALSE(fs::exists(dir.file("step-2/manifest.json")));
}

TEST(Checkpointer, WriteErrorsSurfaceOnTheTrainingThreadAsThePolicySays) {
  test::TempDir dir;
  test::writeText(dir.file("file"), "x");
  at::Tensor w = torch::ones({4});
  auto o = oneRank(dir.file("file/ckpts"));
  {
    ckpt::Checkpointer c(o);  // warn
    c.mark(manifestFor(1), {{"model.bin", {{"w", w, false}}, {}}});
    EXPECT_NO_THROW(c.flush());
    EXPECT_EQ(c.stats().failed, 1);
  }
  o.onError = ckpt::OnError::fail;
  ckpt::Checkpointer c(o);
  c.mark(manifestFor(1), {{"model.bin", {{"w", w, false}}, {}}});
  auto e = test::errorOf<IoError>([&] { c.flush(); });
  EXPECT_NE(e.find("cannot create checkpoint directory " + dir.file("file/ckpts/step-1")),
            std::string::npos)
      << e;
}

// Two optimizers stepping on the same gradients: one continuous, one
// rebuilt from the first one's saved state.
template <class Make>
void expectResumedOptimizerMatches(Make make) {
  torch::manual_seed(1);
  auto a = torch::randn({4, 3}).requires_grad_();
  auto b = a.detach().clone().requires_grad_();
  auto optA = make(std::vector<at::Tensor>{a});
  auto grad = [](int k) { return torch::full({4, 3}, 0.1f * static_cast<float>(k + 1)); };
  for (int k = 0; k < 3; ++k) {
    a.mutable_grad() = grad(k);
    optA->step();
  }
  auto state = train::optimizerState(*optA, {"w"});
  ASSERT_FALSE(state.empty());
  std::vector<std::pair<std::string, at::Tensor>> saved;
  for (auto& [n, t] : state) saved.emplace_back(n, t.clone());
  {
    torch::NoGradGuard g;
    b.copy_(a);
  }
  auto optB = make(std::vector<at::Tensor>{b});
  train::loadOptimizerState(*optB, {"w"}, saved, "test");
  for (int k = 3; k < 6; ++k) {
    a.mutable_grad() = grad(k);
    b.mutable_grad() = grad(k);
    optA->step();
    optB->step();
  }
  EXPECT_TRUE(torch::equal(a, b));
}

TEST(OptimizerState, SgdAndAdamwContinueExactly) {
  OptimizerConfig sgd;
  sgd.momentum = 0.9;
  sgd.weightDecay = 1e-4;
  expectResumedOptimizerMatches([&](std::vector<at::Tensor> p) { return train::createOptimizer(sgd, p); });
  OptimizerConfig adamw;
  adamw.name = OptimizerKind::adamw;
  adamw.lr = 0.01;
  adamw.weightDecay = 0.01;
  expectResumedOptimizerMatches([&](std::vector<at::Tensor> p) { return train::createOptimizer(adamw, p); });
}

TEST(OptimizerState, StateOfAnotherOptimizerOrModelIsRefused) {
  auto p = torch::randn({2}).requires_grad_();
  OptimizerConfig sgd;
  auto opt = train::createOptimizer(sgd, {p});
  auto e = test::errorOf<DataError>([&] {
    train::loadOptimizerState(*opt, {"w"}, {{"w.exp_avg", torch::zeros({2})}}, "f.bin");
  });
  EXPECT_NE(e.find("f.bin: the optimizer state is of another optimizer"), std::string::npos) << e;
  e = test::errorOf<DataError>([&] {
    train::loadOptimizerState(*opt, {"w"}, {{"v.momentum_buffer", torch::zeros({2})}}, "f.bin");
  });
  EXPECT_NE(e.find("'v.momentum_buffer' belongs to no parameter"), std::string::npos) << e;
  e = test::errorOf<DataError>([&] {
    train::loadOptimizerState(*opt, {"w"}, {{"w.momentum_buffer", torch::zeros({3})}}, "f.bin");
  });
  EXPECT_NE(e.find("'w.momentum_buffer' has shape 3, the parameter has 2"), std::string::npos) << e;
}

TEST(JobDiff, ListsChangedKeysWithBothValues) {
  const std::string yaml = test::tinyJobYaml("d");
  JobConfig a = loadJobFromString(yaml, "a");
  JobConfig b = loadJobFromString(yaml, "b", {"training.epochs=5", "training.optimizer.lr=0.01"});
  auto changes = diffJobs(toYaml(a), b);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].key, "training.epochs");
  EXPECT_EQ(changes[0].before, "1");
  EXPECT_EQ(changes[0].after, "5");
  EXPECT_EQ(changes[1].key, "training.optimizer.lr");
  EXPECT_TRUE(diffJobs(toYaml(a), a).empty());
}

TEST(Metrics, DropRecordsAfterKeepsEachStepOnce) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  test::writeText(path,
                  "{\"event\":\"train\",\"step\":1}\n{\"event\":\"train\",\"step\":2}\n"
                  "{\"event\":\"eval\",\"step\":2}\n{\"event\":\"train\",\"step\":3}\nnot json\n");
  monitor::dropRecordsAfter(path, 2);
  EXPECT_EQ(test::readText(path),
            "{\"event\":\"train\",\"step\":1}\n{\"event\":\"train\",\"step\":2}\nnot json\n");
}

}  // namespace
}  // namespace cohort
