// ZeRO stage 3 on the GPT with real processes (docs/zero.md): each block's
// parameters are gathered just before its forward and backward and freed
// after, so a rank holds 1/N of the parameters and gradients between uses.
// N ranks end with the parameters of one process with the global batch,
// with recomputation and accumulation too; a killed rank resumes from a
// stage-3 checkpoint exactly, and the checkpoint loads at stage 0 on
// another world size, and at stage 3 on another, unit by unit; the
// exports of the checkpoint and of final.pt (ONNX and TorchScript) hold the
// same tensors.

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <filesystem>
#include <regex>

#include "cohort/ckpt/state_dict.h"
#include "test_paths.h"
#include "util/corpus.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"

namespace cohort {
namespace {

// As tests/ddp/zero_test.cc: float32 sums in another order, magnified a
// little by AdamW.
constexpr double kStage3Tolerance = 1e-5;

class ZeroStage3 : public ::testing::Test {
 protected:
  void SetUp() override {
    test::writeText(dir.file("corpus.txt"), test::corpus(6'000));
    auto tok = test::cohort({"data", "tokenize", dir.file("corpus.txt"), dir.file("tok"), "--no-progress"});
    ASSERT_EQ(tok.exitCode, 0) << tok.describe();
  }

  // A GPT of 2 blocks (3 units with the embeddings) whose sizes divide by
  // neither 2 nor 3 in every unit, trained for `steps` steps.
  ckpt::StateDict train(const std::string& tag, int procs, int batch, std::vector<std::string> kv,
                        const std::map<std::string, std::string>& env = {},
                        const std::string& resume = "") {
    kv.insert(kv.begin(), "training.batch_size=" + std::to_string(batch));
    const std::vector<std::string> extra =
        resume.empty() ? std::vector<std::string>{} : std::vector<std::string>{"--resume", resume};
    auto r = test::runJob(dir, tag, test::tinyGptYaml(tag, dir.file("tok/train"), 2), procs, kv, env, extra);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
  }

  std::string log(const std::string& tag, int rank) {
    return test::readText(dir.file(fmt::format("{}/logs/rank-{}.log", tag, rank)));
  }

  test::TempDir dir;
};

TEST_F(ZeroStage3, BlocksGatheredOneAtATimeEqualOneProcessWithTheGlobalBatch) {
  auto reference = train("single", 1, 12, {});
  struct Variant {
    const char* tag;
    int ranks, batch;
    std::vector<std::string> kv;
  };
  // On shared memory, but for "three" (Gloo).
  const std::vector<Variant> variants = {
      {"two", 2, 6, {"distribution.zero=3"}},
      {"three", 3, 4, {"distribution.zero=3", "training.clip_grad_norm=0.5", "distribution.shared_memory=false"}},
      // Recomputed blocks inside gathered units; every micro-step's
      // gradients reduce-scattered and added up.
      {"acc", 2, 3, {"distribution.zero=3", "model.recompute=blocks", "training.accumulate_steps=2"}},
  };
  auto clipped = train("single-clip", 1, 12, {"training.clip_grad_norm=0.5"});
  // bf16 autocast: against stage 0 on the same ranks (the same rounding in
  // every rank's forward), since one process rounds other batches.
  const std::string bf16 = "training.precision=bf16";
  auto bf16Plain = train("bf16-plain", 2, 6, {bf16});
  auto bf16Sharded = train("bf16", 2, 6, {bf16, "distribution.zero=3"});
  EXPECT_LT(test::maxDifference(bf16Plain, bf16Sharded), kStage3Tolerance) << "bf16";
  EXPECT_GT(test::maxDifference(bf16Plain, reference), 100 * kStage3Tolerance) << "bf16 made no difference";
  for (const Variant& v : variants) {
    auto run = train(v.tag, v.ranks, v.batch, v.kv);
    const double diff = test::maxDifference(std::string(v.tag) == "three" ? clipped : reference, run);
    EXPECT_LT(diff, kStage3Tolerance) << v.tag;
    RecordProperty(std::string("max_parameter_difference_") + v.tag, fmt::format("{:.3g}", diff));
    const std::string text = log(v.tag, 0);
    EXPECT_NE(text.find("ZeRO stage 3: parameters gathered in 3 units (2 of the model's blocks"),
              std::string::npos)
        << text;
    // No rank built the model whole: its blocks went to their parts one at a time.
    EXPECT_NE(text.find("ZeRO stage 3: built the model unit by unit: 2 units"), std::string::npos) << text;
    const bool gloo = std::string(v.tag) == "three";
    EXPECT_NE(text.find(gloo ? "gradient exchange: Gloo" : "gradient exchange: shared memory"),
              std::string::npos)
        << text;
    // Between uses a rank holds its part of the parameters and gradients.
    const auto summary = nlohmann::json::parse(test::readText(dir.file(std::string(v.tag) + "/summary.json")));
    const auto whole = nlohmann::json::parse(test::readText(dir.file("single/summary.json")));
    const double share = summary["memory"]["parameter_mb"].get<double>() /
                         whole["memory"]["parameter_mb"].get<double>();
    EXPECT_NEAR(share, 1.0 / v.ranks, 0.01) << v.tag << ": " << summary["memory"].dump();
    EXPECT_EQ(summary["memory"]["gradient_mb"], summary["memory"]["parameter_mb"]) << v.tag;
    // Gathered at once, besides the parts: the whole-model unit's
    // parameters and gradients, and at most the current block's, the next
    // one's parameters and the previous one's gradients in flight.
    const double largest = summary["memory"]["largest_unit_mb"].get<double>();
    const double peak = summary["memory"]["unit_peak_mb"].get<double>();
    EXPECT_GT(peak, largest) << v.tag;
    EXPECT_LE(peak, 7.05 * largest) << v.tag;
  }
  // The comparison can fail: clipping at 0.5 changes these weights.
  EXPECT_GT(test::maxDifference(reference, clipped), 100 * kStage3Tolerance);

  // model.init_from read into the parts (each unit cut from the file's
  // tensors): the same as one process starting from the file.
  const std::string from = "model.init_from=" + dir.file("single/model/final.pt");
  auto fromOne = train("from-one", 1, 12, {from});
  auto fromParts = train("from-parts", 2, 6, {from, "distribution.zero=3"});
  EXPECT_LT(test::maxDifference(fromOne, fromParts), kStage3Tolerance);
  EXPECT_GT(test::maxDifference(fromOne, reference), 100 * kStage3Tolerance) << "init_from made no difference";
  EXPECT_NE(log("from-parts", 1).find("one unit at a time"), std::string::npos) << log("from-parts", 1);

  // A block's tensor of another shape: exit 2 naming the file and the
  // tensor, before anything trains.
  ckpt::StateDict bad = fromOne;
  for (auto& [name, t] : bad) {
    if (name == "transformer.h.1.mlp.c_fc.weight") t = torch::zeros({3, 3});
  }
  ckpt::saveStateDict(bad, dir.file("bad.pt"));
  auto r = test::runJob(dir, "bad", test::tinyGptYaml("bad", dir.file("tok/train"), 2), 2,
                        {"training.batch_size=6", "distribution.zero=3", "model.init_from=" + dir.file("bad.pt")});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  for (const std::string& want : {dir.file("bad.pt"), std::string("transformer.h.1.mlp.c_fc.weight")}) {
    EXPECT_NE((r.out + r.err).find(want), std::string::npos) << want << "\n" << r.describe();
  }
}

TEST_F(ZeroStage3, AKilledRankResumesExactlyAndTheCheckpointLoadsAtStage0OnOneRank) {
  const std::vector<std::string> kv = {"distribution.zero=3", "checkpoint.every_steps=3",
                                       "checkpoint.when_behind=wait", "distribution.max_restarts=2",
                                       "training.max_steps=9"};
  auto whole = train("whole", 2, 4, kv);
  auto restarted = train("restarted", 2, 4, kv, {{"COHORT_FAULT", "kill@rank1:step7"}});
  EXPECT_EQ(test::maxDifference(whole, restarted), 0.0);
  const std::string text = log("restarted", 1);
  EXPECT_NE(text.find("resumed from " + dir.file("restarted/checkpoints/step-")), std::string::npos) << text;
  // Each rank read its own parts: the checkpoint was cut as this run cuts.
  EXPECT_NE(text.find("resumed this rank's parameter parts from"), std::string::npos) << text;
  // Checkpoints written straight from the training state (no host copy):
  // the same resume, the same end.
  std::vector<std::string> inPlace = kv;
  inPlace.push_back("checkpoint.max_in_flight=0");
  auto direct = train("in-place", 2, 4, inPlace, {{"COHORT_FAULT", "kill@rank1:step7"}});
  EXPECT_EQ(test::maxDifference(whole, direct), 0.0);
  EXPECT_NE(log("in-place", 1).find("resumed this rank's parameter parts from"), std::string::npos)
      << log("in-place", 1);

  // Each rank wrote its parts of the parameters, and model.bin the rest
  // (this GPT has no buffers: nothing); `cohort ckpt consolidate` puts the
  // model together, in the model's order: the step-9 checkpoint is the
  // final model, bit for bit.
  const std::string step9 = dir.file("whole/checkpoints/step-9");
  for (const char* f : {"model-0.bin", "model-1.bin", "optimizer-0.bin", "optimizer-1.bin", "model.bin"}) {
    EXPECT_TRUE(std::filesystem::exists(step9 + "/" + f)) << f;
  }
  const auto c = test::cohort({"ckpt", "consolidate", step9, dir.file("consolidated.pt")});
  ASSERT_EQ(c.exitCode, 0) << c.describe();
  // (final.pt adds the tied head's name, as model.bin does not.)
  auto consolidated = ckpt::readStateDict(dir.file("consolidated.pt"));
  consolidated.emplace_back("lm_head.weight", consolidated.front().second);
  EXPECT_EQ(consolidated.front().first, "transformer.wte.weight");
  EXPECT_EQ(test::maxDifference(whole, consolidated), 0.0);
  // `cohort export --format onnx` of the checkpoint reads its parts one
  // bucket at a time and writes the same tensors as the export of
  // final.pt; ONNX's checker accepts both.
  // So does --format torchscript (through a mapped file): torch.jit.load
  // finds the ONNX initializers' values under the same names.
  for (const auto& [from, to] : {std::pair{step9, "step9"}, std::pair{dir.file("whole/model/final.pt"), "final"}}) {
    for (const char* format : {"onnx", "torchscript"}) {
      const auto e = test::cohort({"export", from, "--format", format, "--out", dir.file(std::string(to) + "." + format)});
      ASSERT_EQ(e.exitCode, 0) << e.describe();
    }
  }
  const auto same = test::run({COHORT_PYTHON, "-c", R"(
import sys, onnx, torch
from onnx import numpy_helper
def tensors(path):
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
def script(path):
    return {k: v.numpy() for k, v in torch.jit.load(path).state_dict().items()}
a, b = tensors(sys.argv[1] + ".onnx"), tensors(sys.argv[2] + ".onnx")
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
assert all((a[k] == b[k]).all() for k in a)
for path in sys.argv[1:]:
    s = script(path + ".torchscript")
    assert sorted(s) == sorted(k for k in a if k.startswith("transformer.")), (sorted(s), sorted(a))
    assert all((s[k] == a[k]).all() for k in s), path
print(len(a))
)", dir.file("step9"), dir.file("final")});
  EXPECT_EQ(same.exitCode, 0) << same.describe();

  // A rank's parts missing: an error naming the file, nothing written.
  std::filesystem::copy(step9, dir.file("broken"), std::filesystem::copy_options::recursive);
  std::filesystem::remove(dir.file("broken/model-1.bin"));
  const auto broken = test::cohort({"ckpt", "consolidate", dir.file("broken"), dir.file("broken.pt")});
  EXPECT_NE(broken.exitCode, 0) << broken.describe();
  EXPECT_NE((broken.out + broken.err).find(dir.file("broken/model-1.bin")), std::string::npos)
      << broken.describe();
  EXPECT_FALSE(std::filesystem::exists(dir.file("broken.pt")));

  // One process at stage 0 with the same global batch goes on from the
  // step-3 checkpoint to the same end.
  const std::string step3 = dir.file("whole/checkpoints/step-3");
  auto one = train("one", 1, 8, {"training.max_steps=9"}, {}, step3);
  const double diff = test::maxDifference(whole, one);
  EXPECT_LT(diff, kStage3Tolerance);
  RecordProperty("stage3_resumed_on_one_rank_at_stage0", fmt::format("{:.3g}", diff));
  EXPECT_NE(log("one", 0).find("optimizer state re-cut: ZeRO stage 3 on 2 ranks"), std::string::npos)
      << log("one", 0);

  // Four ranks at stage 3 with the same global batch, the model built unit
  // by unit: each unit's parameters and optimizer state are put together
  // from the two ranks' parts and cut in four, one unit at a time.
  auto four = train("four", 4, 2, {"distribution.zero=3", "training.max_steps=9"}, {}, step3);
  const double fourDiff = test::maxDifference(whole, four);
  EXPECT_LT(fourDiff, kStage3Tolerance);
  RecordProperty("stage3_two_ranks_resumed_on_four", fmt::format("{:.3g}", fourDiff));
  for (const char* said : {"cut otherwise than this run: one unit at a time",
                           "optimizer state re-cut: ZeRO stage 3 on 2 ranks in 3 buckets in the checkpoint, ZeRO stage 3 on 4 ranks"}) {
    EXPECT_NE(log("four", 3).find(said), std::string::npos) << said << "\n" << log("four", 3);
  }
}

}  // namespace
}  // namespace cohort
