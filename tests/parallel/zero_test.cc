// ZeRO stages 1 and 2 with real processes (docs/zero.md): N ranks, each
// stepping only its part of the parameters, end with the parameters of one
// process with the global batch; on shared memory, on Gloo and on the
// hierarchical exchange; with AdamW, gradient clipping and a parameter
// count that does not divide by N. Their checkpoints resume exactly, at
// their own stage or another.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>

#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"
#include "test_paths.h"

namespace cohort {
namespace {

// As tests/ddp/equivalence_test.cc: float32 sums in another order differ
// by ~1e-8 after 5 steps; AdamW's division by sqrt(v) magnifies that a
// little, 1e-5 leaves room.
constexpr double kZeroTolerance = 1e-5;

// hidden 17: a bias of 17 and weights of 17 x k, divisible by neither 2
// nor 3, so the buckets are padded. AdamW keeps two state tensors.
std::vector<std::string> job(int batch, std::vector<std::string> more = {}) {
  for (const char* s : {"training.max_steps=5", "model.hidden=17", "training.optimizer.name=adamw",
                        "training.optimizer.lr=0.01", "training.optimizer.weight_decay=0.01"}) {
    more.push_back(s);
  }
  more.push_back("training.batch_size=" + std::to_string(batch));
  return more;
}

// "ZeRO stage S: this rank steps X of Y parameter elements" from a rank's log.
std::pair<int64_t, int64_t> stepped(const test::TempDir& dir, const std::string& tag, int rank) {
  const std::string log = test::readText(dir.file(fmt::format("{}/logs/rank-{}.log", tag, rank)));
  std::smatch m;
  if (!std::regex_search(log, m, std::regex(R"(this rank steps (\d+) of (\d+) parameter elements)"))) {
    ADD_FAILURE() << tag << " rank " << rank << " logged no ZeRO line:\n" << log;
    return {0, 0};
  }
  return {std::stoll(m[1]), std::stoll(m[2])};
}

struct Variant {
  const char* tag;
  int ranks;
  std::vector<std::string> settings;
  std::map<std::string, std::string> env;
};

class Zero : public ::testing::TestWithParam<int> {};

TEST_P(Zero, EveryExchangeEqualsOneProcessWithTheGlobalBatch) {
  const int ranks = GetParam();
  const int b = 4;
  test::TempDir dir;
  const std::string tiny = "distribution.bucket_cap_mb=1e-6", one = "distribution.bucket_cap_mb=1000";
  const std::string gloo = "distribution.shared_memory=false";
  auto reference = test::trainTiny(dir, "single", 1, job(ranks * b));
  std::vector<Variant> variants = {
      {"shm1", ranks, {"distribution.zero=1", tiny}, {}},
      {"shm2", ranks, {"distribution.zero=2", tiny}, {}},
      {"gloo1", ranks, {"distribution.zero=1", one, gloo}, {}},
      {"gloo2", ranks, {"distribution.zero=2", tiny, gloo}, {}},
      // This model is one unit.
      {"shm3", ranks, {"distribution.zero=3"}, {}},
      {"gloo3", ranks, {"distribution.zero=3", gloo}, {}},
  };
  if (ranks == 3) {
    variants.push_back({"hier1", 3, {"distribution.zero=1", tiny}, {{"COHORT_MACHINE_ID", "a,a,b"}}});
    variants.push_back({"hier2", 3, {"distribution.zero=2", tiny}, {{"COHORT_MACHINE_ID", "a,a,b"}}});
    variants.push_back({"hier3", 3, {"distribution.zero=3"}, {{"COHORT_MACHINE_ID", "a,a,b"}}});
  }
  for (const Variant& v : variants) {
    auto sharded = test::trainTiny(dir, v.tag, v.ranks, job(b, v.settings), v.env);
    const double diff = test::maxDifference(reference, sharded);
    EXPECT_LT(diff, kZeroTolerance) << v.tag;
    RecordProperty(std::string("max_parameter_difference_") + v.tag, fmt::format("{:.3g}", diff));
    // Each rank steps its part: 1/N of the (padded) elements, together all.
    int64_t sum = 0;
    for (int r = 0; r < v.ranks; ++r) {
      const auto [mine, all] = stepped(dir, v.tag, r);
      EXPECT_EQ(mine * v.ranks, all) << v.tag << " rank " << r;
      sum += mine;
      if (r == v.ranks - 1) {
        EXPECT_EQ(sum, all) << v.tag;
      }
    }
  }
  // From stage 2 on a rank holds its part of the summed gradients only
  // (the full ones just from a bucket's first gradient to its exchange).
  auto gradientMb = [&](const std::string& tag) {
    return nlohmann::json::parse(test::readText(dir.file(tag + "/summary.json")))["memory"]["gradient_mb"].get<double>();
  };
  for (const char* tag : {"shm2", "gloo2"}) {
    EXPECT_NEAR(gradientMb(tag) * ranks / gradientMb("shm1"), 1.0, 1e-9) << tag;
  }
  EXPECT_NE(test::readText(dir.file("gloo2/logs/rank-0.log")).find("ZeRO stage 2: at most"), std::string::npos);
  // Each took the exchange it names.
  auto logged = [&](const std::string& tag, const std::string& text) {
    const std::string log = test::readText(dir.file(tag + "/logs/rank-0.log"));
    EXPECT_NE(log.find(text), std::string::npos) << tag << ":\n" << log;
  };
  logged("shm3", "gradient exchange: shared memory");
  logged("gloo3", "gradient exchange: Gloo (distribution.shared_memory is false)");
  if (ranks == 3) {
    logged("hier1", "path: hierarchical");
    for (const char* tag : {"hier2", "hier3"}) logged(tag, "gradient exchange: Gloo among all ranks (2 machines");
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, Zero, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// training.clip_grad_norm clips by the norm over every rank's part, the
// same as one process clipping the whole gradient; and it does clip.
TEST(ZeroClip, TheGlobalNormIsClippedAsInOneProcess) {
  test::TempDir dir;
  const std::string clip = "training.clip_grad_norm=0.05";
  auto reference = test::trainTiny(dir, "single", 1, job(8, {clip}));
  auto unclipped = test::trainTiny(dir, "unclipped", 1, job(8));
  auto sharded = test::trainTiny(dir, "zero2", 2, job(4, {clip, "distribution.zero=2"}));
  auto gloo = test::trainTiny(dir, "gloo2", 2,
                              job(4, {clip, "distribution.zero=2", "distribution.shared_memory=false"}));
  EXPECT_LT(test::maxDifference(reference, sharded), kZeroTolerance);
  EXPECT_LT(test::maxDifference(reference, gloo), kZeroTolerance);
  EXPECT_GT(test::maxDifference(reference, unclipped), 100 * kZeroTolerance) << "nothing was clipped";
}

// The rest of what stages 1 to 3 must work with, on 2 ranks: SGD with
// momentum (the fused step on parts), accumulation, and a NaN in one
// rank's loss, after which every rank skips the same step (on shared
// memory the reduce-scatter reports it, on Gloo one collective).
TEST(ZeroWith, SgdAccumulationAndASkippedNonFiniteStep) {
  test::TempDir dir;
  const std::string gloo = "distribution.shared_memory=false";
  auto sgd = [](std::vector<std::string> kv) {
    kv.push_back("training.optimizer.name=sgd");
    kv.push_back("training.optimizer.lr=0.05");
    return kv;
  };
  auto sgdRef = test::trainTiny(dir, "sgd-ref", 1, job(8, sgd({})));
  for (const std::string stage : {"1", "2", "3"}) {
    auto run = test::trainTiny(dir, "sgd" + stage, 2, job(4, sgd({"distribution.zero=" + stage, gloo})));
    EXPECT_LT(test::maxDifference(sgdRef, run), kZeroTolerance) << "sgd, stage " << stage;
  }
  auto accRef = test::trainTiny(dir, "acc-ref", 1, job(8, {"training.accumulate_steps=2"}));
  auto acc = test::trainTiny(dir, "acc", 2, job(4, {"training.accumulate_steps=2", "distribution.zero=2"}));
  EXPECT_LT(test::maxDifference(accRef, acc), kZeroTolerance) << "accumulation at stage 2";

  const std::map<std::string, std::string> nan{{"COHORT_FAULT", "nan@rank1:step2"}};
  auto nanRef = test::trainTiny(dir, "nan-ref", 2, job(4, {"training.on_nonfinite=skip"}), nan);
  for (const std::string& path : {std::string("shm"), std::string("gloo"), std::string("stage3")}) {
    std::vector<std::string> kv{"training.on_nonfinite=skip",
                                path == "stage3" ? "distribution.zero=3" : "distribution.zero=2"};
    if (path == "gloo") kv.push_back(gloo);
    auto run = test::trainTiny(dir, "nan-" + path, 2, job(4, kv), nan);
    EXPECT_LT(test::maxDifference(nanRef, run), kZeroTolerance) << path;
    const auto summary = nlohmann::json::parse(test::readText(dir.file("nan-" + path + "/summary.json")));
    EXPECT_EQ(summary["nonfinite_skipped"], 1) << path << ": " << summary.dump();
  }
}

// A rank killed at step 7 restarts from a checkpoint (step 3 or 6: with
// when_behind=wait step 3 is committed before rank 1 can finish step 7),
// whose optimizer state is in one file per rank, and ends with the weights
// of an uninterrupted run, bit for bit; other stages resume from it too.
TEST(ZeroCheckpoint, AKilledRankResumesFromPerRankFilesAndOtherStagesResumeFromThem) {
  test::TempDir dir;
  std::vector<std::string> settings =
      job(4, {"distribution.zero=2", "checkpoint.every_steps=3", "checkpoint.when_behind=wait",
              "distribution.max_restarts=2"});
  for (auto& kv : settings) {
    if (kv == "training.max_steps=5") kv = "training.max_steps=9";
  }
  auto whole = test::trainTiny(dir, "whole", 2, settings);
  auto restarted = test::trainTiny(dir, "restarted", 2, settings, {{"COHORT_FAULT", "kill@rank1:step7"}});
  EXPECT_EQ(test::maxDifference(whole, restarted), 0.0);
  for (const char* f : {"optimizer-0.bin", "optimizer-1.bin", "model.bin"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.file(std::string("restarted/checkpoints/step-3/") + f))) << f;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("restarted/checkpoints/step-3/optimizer.bin")));
  const std::string log = test::readText(dir.file("restarted/logs/rank-1.log"));
  EXPECT_NE(log.find("resumed from " + dir.file("restarted/checkpoints/step-")), std::string::npos) << log;

  // `cohort ckpt consolidate` puts the parts back together: the same state
  // as a stage-0 run's at that step (within the sums' rounding), in a file
  // torch.optim.AdamW loads and steps with.
  std::vector<std::string> plainSettings;
  for (const std::string& kv : settings) plainSettings.push_back(kv == "distribution.zero=2" ? "distribution.zero=0" : kv);
  test::trainTiny(dir, "plain", 2, plainSettings);
  for (const char* tag : {"whole", "plain"}) {
    const auto c = test::cohort({"ckpt", "consolidate", dir.file(std::string(tag) + "/checkpoints/step-3"),
                                 dir.file(std::string(tag) + "-model.pt"), "--optimizer",
                                 dir.file(std::string(tag) + "-adamw.pt")});
    ASSERT_EQ(c.exitCode, 0) << c.describe();
  }
  const auto py = test::run({COHORT_PYTHON, "-c", R"(
import sys, torch
a, b, m = torch.load(sys.argv[1]), torch.load(sys.argv[2]), torch.load(sys.argv[3])
assert sorted(a) == ["param_groups", "state"], sorted(a)
assert len(a["state"]) == len(b["state"]) == len(m) > 0, (len(a["state"]), len(b["state"]), len(m))
worst = 0.0
for i, s in a["state"].items():
    assert float(s["step"]) == 3, s["step"]
    for k in ("exp_avg", "exp_avg_sq"):
        x, y = s[k], b["state"][i][k]
        assert x.shape == y.shape, (i, k, x.shape, y.shape)
        worst = max(worst, ((x - y).abs().max() / (1e-12 + y.abs().max())).item())
assert worst < 1e-4, worst
params = [torch.zeros_like(t, requires_grad=True) for t in m.values()]
opt = torch.optim.AdamW(params, lr=0.01)
opt.load_state_dict(a)
for p in params: p.grad = torch.ones_like(p)
opt.step()
print("ok", len(params), "parameters, worst relative difference", worst)
)", dir.file("whole-adamw.pt"), dir.file("plain-adamw.pt"), dir.file("whole-model.pt")});
  EXPECT_EQ(py.exitCode, 0) << py.describe();
  RecordProperty("consolidated", py.out);

  // A stage-0 checkpoint resumed at stage 2 cuts its one file into parts.
  {
    std::vector<std::string> args{"run", dir.file("plain.yaml"), "--procs", "2", "--run-dir",
                                  dir.file("plain-as2"), "--resume", dir.file("plain/checkpoints/step-3")};
    for (const std::string& kv : settings) {
      args.push_back("--set");
      args.push_back(kv);  // distribution.zero=2
    }
    const auto r = test::cohort(args);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_LT(test::maxDifference(whole, ckpt::readStateDict(dir.file("plain-as2/model/final.pt"))), kZeroTolerance);
    const std::string log = test::readText(dir.file("plain-as2/logs/rank-1.log"));
    EXPECT_NE(log.find("optimizer state re-cut: unsharded (distribution.zero 0) in the checkpoint, "
                       "ZeRO stage 2 on 2 ranks"),
              std::string::npos)
        << log;
  }

  // The same checkpoint resumed at stage 0 (one optimizer state, put back
  // together from the parts) and at stage 1 (the same parts) ends with the
  // uninterrupted run's weights.
  for (const char* stage : {"0", "1"}) {
    const std::string tag = std::string("as") + stage;
    std::vector<std::string> args{"run", dir.file("whole.yaml"), "--procs", "2", "--run-dir",
                                  dir.file(tag), "--resume", dir.file("whole/checkpoints/step-3")};
    for (std::string kv : settings) {
      if (kv == "distribution.zero=2") kv = std::string("distribution.zero=") + stage;
      args.push_back("--set");
      args.push_back(kv);
    }
    const auto r = test::cohort(args);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    const double diff = test::maxDifference(whole, ckpt::readStateDict(dir.file(tag + "/model/final.pt")));
    EXPECT_LT(diff, kZeroTolerance) << "resumed at stage " << stage;
    RecordProperty(std::string("stage2_resumed_at_stage") + stage, fmt::format("{:.3g}", diff));
    const std::string log = test::readText(dir.file(tag + "/logs/rank-0.log"));
    if (std::string(stage) == "0") {
      EXPECT_NE(log.find("optimizer state re-cut: ZeRO stage 2 on 2 ranks"), std::string::npos) << log;
    } else {
      EXPECT_EQ(log.find("re-cut"), std::string::npos) << "stage 1 takes stage 2's parts as they are";
    }
  }
}

// A checkpoint resumes on another world size, stage and batch: the epoch
// goes on from the sample its ranks had reached together, and the run ends
// with the weights of one process that takes the same global batches (its
// batch changed at the same step), within float32's rounding.
struct Resize {
  const char* name;
  int ranksBefore, ranksAfter;
  const char* zeroBefore;
  const char* zeroAfter;
};

void PrintTo(const Resize& r, std::ostream* os) { *os << r.name; }

class ZeroResize : public ::testing::TestWithParam<Resize> {};

TEST_P(ZeroResize, TheEpochGoesOnFromTheSameSampleWithTheSameState) {
  const Resize rz = GetParam();
  const int b = 4;
  test::TempDir dir;
  auto settings = [&](int batch, const std::string& zero, bool first) {
    std::vector<std::string> kv =
        job(batch, {"distribution.zero=" + zero, "checkpoint.every_steps=3", "checkpoint.keep_last=100"});
    for (auto& k : kv) {
      if (k == "training.max_steps=5") k = first ? "training.max_steps=3" : "training.max_steps=0";
    }
    return kv;
  };
  auto resumed = [&](const std::string& tag, const std::string& from, int procs, std::vector<std::string> kv) {
    std::vector<std::string> args{"run", dir.file(from + ".yaml"), "--procs", std::to_string(procs),
                                  "--run-dir", dir.file(tag), "--resume", dir.file(from + "/checkpoints/step-3")};
    for (auto& k : kv) {
      args.push_back("--set");
      args.push_back(k);
    }
    const auto r = test::cohort(args);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
  };
  // One process: 3 steps of the first run's global batch, then the second's.
  test::trainTiny(dir, "ref", 1, settings(b * rz.ranksBefore, "0", true));
  auto reference = resumed("ref-after", "ref", 1, settings(b * rz.ranksAfter, "0", false));
  test::trainTiny(dir, "before", rz.ranksBefore, settings(b, rz.zeroBefore, true));
  auto after = resumed("after", "before", rz.ranksAfter, settings(b, rz.zeroAfter, false));
  const double diff = test::maxDifference(reference, after);
  EXPECT_LT(diff, kZeroTolerance);
  RecordProperty("max_parameter_difference", fmt::format("{:.3g}", diff));
  const std::string log = test::readText(dir.file("after/logs/rank-0.log"));
  const std::string position = fmt::format(
      "epoch 1 from sample {} of its order (written by {} ranks with batch 4, cut now for {} x batch 4)",
      3 * b * rz.ranksBefore, rz.ranksBefore, rz.ranksAfter);
  EXPECT_NE(log.find(position), std::string::npos) << log;
  // The same number of steps on both sides: the rest of the epoch.
  auto steps = [&](const std::string& tag) {
    return nlohmann::json::parse(test::readText(dir.file(tag + "/summary.json")))["steps"].get<int64_t>();
  };
  EXPECT_EQ(steps("after"), steps("ref-after"));
  EXPECT_GT(steps("after"), 6);
  // A checkpoint of the taken-up epoch counts its position from where the
  // epoch was taken up, so that any later resume goes on from there.
  const auto m = nlohmann::json::parse(test::readText(dir.file("after/checkpoints/step-6/manifest.json")));
  EXPECT_EQ(m["extra"]["epoch_start"], 3 * b * rz.ranksBefore) << m.dump();
  EXPECT_EQ(m["samples_in_epoch"], 3 * b * rz.ranksBefore + 3 * b * rz.ranksAfter) << m.dump();
  // The comparison can fail: not resuming (the first run's weights) is far.
  EXPECT_GT(test::maxDifference(reference, ckpt::readStateDict(dir.file("before/model/final.pt"))),
            100 * kZeroTolerance);
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizes, ZeroResize,
    ::testing::Values(Resize{"TwoToThreeAtStage2", 2, 3, "2", "2"},
                      Resize{"ThreeToTwoFromStage1ToStage2", 3, 2, "1", "2"},
                      Resize{"TwoToOneFromStage2ToStage0", 2, 1, "2", "0"},
                      Resize{"TwoToThreeAtStage3", 2, 3, "3", "3"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cohort
