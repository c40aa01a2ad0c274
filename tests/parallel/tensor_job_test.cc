// Tensor parallelism in jobs, with real processes (docs/parallelism.md):
// each layer of the GPT split over distribution.tensor ranks. T = 2 and 4,
// T = 2 x R = 2 at ZeRO 1 and 2, with recompute, sequence parallelism,
// clipping and accumulation, end with the parameters of one process with
// the global batch; bf16 follows the unsplit model; evaluation reads the
// vocabulary's slices to the same figures; a killed slice restarts every
// rank from the newest checkpoint to bitwise the same end; the slices'
// checkpoint consolidates to the whole model and resumes with another
// split, or none, where the run that kept its layout ended (and a whole
// run's in a split); bad settings exit 2 naming the key.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "util/corpus.h"
#include "util/job_runs.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"

namespace cohort::tensor_job_test {

// As the pipeline's (pipeline_test.cc): 6 AdamW steps at lr 0.01 of sums
// grouped otherwise (a layer's products summed over the tensor ranks'
// halves, the cross-entropy from the vocabulary's slices) stay within
// about S x lr x 2^-12.
constexpr double kTolerance = 1e-5;
// Against one process, the slices' own products: oneDNN's sgemm (linear
// layers, models/linear.h) blocks a product by its shape, so a column
// slice's sums are grouped otherwise than the whole product's too, where
// OpenBLAS gave the whole's bitwise. Measured: 1.53e-5 at most over the
// variants below (t2), against 1e-5 with OpenBLAS's products; S x lr x 2^-11.
constexpr double kSlicedTolerance = 6 * 0.01 / 2048;
// bf16 rounds each product to 8 bits of mantissa; a slice's matrix product
// is blocked otherwise than the whole one's (pipeline_test.cc derives it).
constexpr double kBf16Tolerance = 6 * 0.01 / 64;

class TensorJob : public test::JobRuns {
 protected:
  void SetUp() override { tokenizeCorpus(); }

  // A GPT of 2 blocks, 4 heads of 4, the bytes' 256 tokens, trained for 6
  // steps of `batch` per rank on `procs` ranks with `kv` (--set) on top.
  // Returns model/final.pt.
  ckpt::StateDict gpt(const std::string& tag, int procs, int batch, std::vector<std::string> kv,
                      const std::map<std::string, std::string>& env = {}, int exitCode = 0) {
    const std::string yaml = "name: " + tag + R"(
model: {arch: gpt, n_layer: 2, n_head: 4, n_embd: 16, block_size: 12, vocab_size: 256}
data:
  train: {kind: tokens, path: )" + dir.file("tok/train") + R"(}
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
    return run(tag, yaml, procs, batch, std::move(kv), env, exitCode);
  }
};

TEST_F(TensorJob, SplitLayersEqualOneProcessWithTheGlobalBatch) {
  // Global batch 8 everywhere.
  auto reference = gpt("single", 1, 8, {});
  auto clipped = gpt("single-clip", 1, 8, {"training.clip_grad_norm=0.3"});
  struct Variant {
    const char* tag;
    int procs;
    int batch;
    std::vector<std::string> kv;
    bool clip = false;
  };
  const std::vector<Variant> variants = {
      {"t2", 2, 8, {"distribution.tensor=2"}},
      // The slices' exchanges over Gloo instead of shared memory.
      {"t2-gloo", 2, 8, {"distribution.tensor=2", "distribution.shared_memory=false"}},
      {"t2-recompute-sp", 2, 8,
       {"distribution.tensor=2", "model.recompute=blocks", "distribution.sequence_parallel=true"}},
      {"t4-sp", 4, 8, {"distribution.tensor=4", "distribution.sequence_parallel=true"}},
      {"t2r2-zero1", 4, 4, {"distribution.tensor=2", "distribution.zero=1", "model.recompute=blocks"}},
      // Each block's slices sharded among the replicas, gathered around
      // its forward and backward.
      {"t2r2-zero3", 4, 4, {"distribution.tensor=2", "distribution.zero=3", "model.recompute=blocks"}},
      // Clipping over every slice's gradients (the whole tensors counted
      // once), accumulation, the gradients reduce-scattered among replicas.
      {"t2r2-zero2-clip", 4, 2,
       {"distribution.tensor=2", "distribution.zero=2", "training.clip_grad_norm=0.3",
        "training.accumulate_steps=2", "distribution.sequence_parallel=true"},
       true},
      {"t2-clip", 2, 8, {"distribution.tensor=2", "training.clip_grad_norm=0.3"}, true},
      // A pipeline of split stages: T = 2 x P = 2, 1F1B over 2 micro-batches
      // of 4, clipping over every stage's slices (the tied embedding's once).
      {"t2p2-clip", 4, 4,
       {"distribution.tensor=2", "distribution.pipeline.stages=2", "distribution.pipeline.micro_batches=2",
        "training.clip_grad_norm=0.3", "model.recompute=blocks"},
       true},
  };
  for (const Variant& v : variants) {
    auto run = gpt(v.tag, v.procs, v.batch, v.kv);
    if (run.empty()) continue;
    // The whole model in the usual names and shapes.
    const double diff = test::maxDifference(v.clip ? clipped : reference, run);
    EXPECT_LT(diff, kSlicedTolerance) << v.tag;
    RecordProperty(std::string("max_parameter_difference_") + v.tag, fmt::format("{:.3g}", diff));
    const int t = v.procs == 4 && std::string(v.tag).rfind("t4", 0) == 0 ? 4 : 2;
    EXPECT_NE(log(v.tag, 0).find(fmt::format("x {} tensor ranks; this rank is slice 0/{}", t, t)),
              std::string::npos)
        << log(v.tag, 0);
    EXPECT_NE(log(v.tag, 1).find("parameters in this rank's slices (slice 1/"), std::string::npos)
        << log(v.tag, 1);
    // Each sample counted once, not once per slice.
    EXPECT_EQ(summaryOf(v.tag)["train_images"], summaryOf("single")["train_images"]) << v.tag;
  }
  // The comparison can fail: clipping at 0.3 changes these weights.
  EXPECT_GT(test::maxDifference(reference, clipped), 100 * kSlicedTolerance);
  // What the exchanges carried per step, against Megatron's count: per
  // block one sum after attention and one after the MLP, forward and
  // backward; then the embedding's sum, the head's input gradient, and the
  // cross-entropy's three sums of one value per token.
  const auto split = summaryOf("t2")["tensor"];
  const int64_t tokens = 8 * 12, activation = tokens * 16 * 4;  // [batch, block_size, n_embd] in float32
  EXPECT_EQ(split["sums_per_step"], 4 * 2 + 2 + 3) << split.dump();
  EXPECT_EQ(split["sum_bytes_per_step"], (4 * 2 + 2) * activation + 3 * tokens * 4) << split.dump();
  EXPECT_EQ(split["block_sum_bytes_per_step_expected"], 4 * 2 * activation) << split.dump();
  EXPECT_EQ(split["gathers"], 0) << split.dump();
  EXPECT_GT(summaryOf("t4-sp")["tensor"]["gathers"].get<int64_t>(), 0);
  // On one machine the slices exchange through shared memory, unless told not to.
  EXPECT_NE(log("t2", 1).find("tensor-parallel exchange: shared memory"), std::string::npos) << log("t2", 1);
  EXPECT_NE(log("t2-gloo", 1).find("tensor-parallel exchange: Gloo (distribution.shared_memory is false)"),
            std::string::npos)
      << log("t2-gloo", 1);
  // Each rank holds about 1/T of the model: the slices' parameters.
  const auto whole = summaryOf("single")["parameters"].get<int64_t>();
  const auto slice = summaryOf("t4-sp")["parameters"].get<int64_t>();
  EXPECT_LT(slice, whole / 3) << "a rank of T = 4 holds " << slice << " of " << whole;
}

TEST_F(TensorJob, Bf16FollowsTheUnsplitModel) {
  // A split layer sums the slices' bf16 products in another grouping than
  // the whole layer's one product: a rounding of bf16's own size, which
  // AdamW turns into a step of about lr wherever a gradient is about zero
  // (the attention's key bias, whose gradient is exactly zero in exact
  // arithmetic). So the split run is held to the unsplit bf16 run's own
  // distance from float32, and to its losses step by step.
  const std::string bf16 = "training.precision=bf16";
  auto plain = gpt("bf16-plain", 1, 8, {bf16});
  auto split = gpt("bf16-t2", 2, 8, {bf16, "distribution.tensor=2"});
  auto fp32 = gpt("fp32", 1, 8, {});
  const double own = test::maxDifference(plain, fp32), splitFromFp32 = test::maxDifference(split, fp32);
  EXPECT_GT(own, 2 * kBf16Tolerance) << "bf16 made no difference";
  EXPECT_LT(splitFromFp32, 1.5 * own);
  RecordProperty("bf16_from_fp32", fmt::format("{:.3g}", own));
  RecordProperty("bf16_split_from_fp32", fmt::format("{:.3g}", splitFromFp32));
  auto losses = [&](const std::string& tag) {
    std::vector<double> out;
    std::istringstream in(test::readText(dir.file(tag + "/metrics.jsonl")));
    for (std::string line; std::getline(in, line);) {
      const auto r = nlohmann::json::parse(line);
      if (r.value("event", "") == "train") out.push_back(r["loss"].get<double>());
    }
    return out;
  };
  const std::vector<double> a = losses("bf16-plain"), b = losses("bf16-t2");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 0.01) << "step " << k + 1;
}

TEST_F(TensorJob, EvaluationFromTheVocabularySlicesGivesTheSameFigures) {
  const std::vector<std::string> eval = {"data.eval.kind=tokens", "data.eval.path=" + dir.file("tok/val"),
                                         "training.max_steps=4"};
  std::vector<std::string> split = eval;
  split.push_back("distribution.tensor=2");
  gpt("eval-one", 1, 8, eval);
  gpt("eval-t2", 2, 8, split);
  const auto a = summaryOf("eval-one")["eval"], b = summaryOf("eval-t2")["eval"];
  ASSERT_TRUE(a.contains("loss") && b.contains("loss")) << a.dump() << b.dump();
  EXPECT_NEAR(a["loss"].get<double>(), b["loss"].get<double>(), 1e-5);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["samples"], b["samples"]);
  EXPECT_DOUBLE_EQ(a["top1"].get<double>(), b["top1"].get<double>());
  EXPECT_NEAR(a["top5"].get<double>(), b["top5"].get<double>(), 1e-9);
}

TEST_F(TensorJob, AKilledSliceRestartsEveryRankToBitwiseTheSameEnd) {
  const std::vector<std::string> kv = {"distribution.tensor=2", "checkpoint.every_steps=3",
                                       "checkpoint.when_behind=wait", "distribution.max_restarts=2",
                                       "training.max_steps=9"};
  auto whole = gpt("whole", 2, 8, kv);
  auto restarted = gpt("restarted", 2, 8, kv, {{"COHORT_FAULT", "kill@rank1:step7"}});
  EXPECT_EQ(test::maxDifference(whole, restarted), 0.0);
  EXPECT_NE(log("restarted", 0).find("resumed from " + dir.file("restarted/checkpoints/step-")),
            std::string::npos)
      << log("restarted", 0);

  // Each slice wrote its own files; consolidate puts every split tensor
  // together: the step-9 checkpoint is the final model.
  const std::string step9 = dir.file("whole/checkpoints/step-9");
  for (const char* f : {"slice0-model.bin", "slice1-model.bin", "slice0-optimizer.bin", "slice1-optimizer.bin",
                        "rank-0.bin", "rank-1.bin"}) {
    EXPECT_TRUE(std::filesystem::exists(step9 + "/" + f)) << f;
  }
  EXPECT_FALSE(std::filesystem::exists(step9 + "/model.bin"));
  const auto c = test::cohort({"ckpt", "consolidate", step9, "--out", dir.file("consolidated.pt"), "--optimizer",
                               dir.file("optimizer.pt")});
  ASSERT_EQ(c.exitCode, 0) << c.describe();
  EXPECT_NE(c.out.find("each layer split over 2 tensor ranks"), std::string::npos) << c.describe();
  auto consolidated = ckpt::readStateDict(dir.file("consolidated.pt"));
  consolidated.emplace_back("lm_head.weight", consolidated.front().second);
  EXPECT_EQ(test::maxDifference(whole, consolidated), 0.0);

  // cohort generate reads the slices' checkpoint one tensor at a time as
  // the whole model: the same text as from model/final.pt.
  const std::vector<std::string> generate = {"generate", dir.file("whole"), "--prompt", "the ", "--tokens", "24",
                                             "--seed", "3"};
  const auto fromFinal = test::cohort(generate);
  ASSERT_EQ(fromFinal.exitCode, 0) << fromFinal.describe();
  std::filesystem::rename(dir.file("whole/model/final.pt"), dir.file("final.pt"));
  const auto fromSlices = test::cohort(generate);
  ASSERT_EQ(fromSlices.exitCode, 0) << fromSlices.describe();
  EXPECT_NE(fromSlices.err.find("weights from " + step9), std::string::npos) << fromSlices.describe();
  EXPECT_EQ(fromFinal.out, fromSlices.out);
  EXPECT_GT(fromFinal.out.size(), 4u);
  std::filesystem::rename(dir.file("final.pt"), dir.file("whole/model/final.pt"));

  // A pipeline of split stages too: the last stage's slice 1 killed after
  // step 7 (the checkpoint of step 6, or of step 3 if step 6's is still
  // being written, is where every rank goes on).
  const std::vector<std::string> staged = {"distribution.tensor=2", "distribution.pipeline.stages=2",
                                           "distribution.pipeline.micro_batches=2", "checkpoint.every_steps=3",
                                           "checkpoint.when_behind=wait", "distribution.max_restarts=2",
                                           "training.max_steps=9"};
  auto stagedWhole = gpt("staged", 4, 4, staged);
  auto stagedRestarted = gpt("staged-restarted", 4, 4, staged, {{"COHORT_FAULT", "kill@rank3:step7"}});
  EXPECT_EQ(test::maxDifference(stagedWhole, stagedRestarted), 0.0);
  EXPECT_NE(log("staged-restarted", 0).find("resumed from "), std::string::npos) << log("staged-restarted", 0);
  EXPECT_TRUE(std::filesystem::exists(dir.file("staged/checkpoints/step-9/slice1-stage1-model.bin")));
  const auto sc = test::cohort({"ckpt", "consolidate", dir.file("staged/checkpoints/step-9"), "--out",
                                dir.file("staged.pt")});
  ASSERT_EQ(sc.exitCode, 0) << sc.describe();
  auto stagedConsolidated = ckpt::readStateDict(dir.file("staged.pt"));
  stagedConsolidated.emplace_back("lm_head.weight", stagedConsolidated.front().second);
  EXPECT_EQ(test::maxDifference(stagedWhole, stagedConsolidated), 0.0);

  // The replicas and their ZeRO stage may change on resume (the slices'
  // optimizer state re-cut): step 6 of T = 2 goes on at T = 2 x R = 2 at
  // ZeRO stage 3, batch 4 per replica, to where the run without the
  // change ended.
  const auto recut = test::cohort({"run", dir.file("whole.yaml"), "--procs", "4", "--run-dir", dir.file("recut"),
                                   "--resume", dir.file("whole/checkpoints/step-6"), "--set",
                                   "training.batch_size=4", "--set", "training.max_steps=9", "--set",
                                   "distribution.tensor=2", "--set", "distribution.zero=3"});
  ASSERT_EQ(recut.exitCode, 0) << recut.describe();
  EXPECT_NE(log("recut", 0).find("optimizer state re-cut: unsharded (distribution.zero 0) in the checkpoint, ZeRO "
                                 "stage 3 on 2 ranks"),
            std::string::npos)
      << log("recut", 0);
  EXPECT_LT(test::maxDifference(whole, ckpt::readStateDict(dir.file("recut/model/final.pt"))), kTolerance);

  // Another split resumes restaged: step 6 of T = 2 goes on at T = 1 on
  // one rank, and at R = 4 at ZeRO stage 2 (batch 2 each: the same 8
  // samples a step), to where T = 2 ended; each rank reads the slices'
  // files and keeps what it holds now.
  for (const auto& [tag, procs, kv] : std::vector<std::tuple<std::string, std::string, std::vector<std::string>>>{
           {"t1", "1", {"training.batch_size=8"}},
           {"r4-zero2", "4", {"training.batch_size=2", "distribution.zero=2"}}}) {
    std::vector<std::string> args{"run", dir.file("whole.yaml"), "--procs", procs, "--run-dir", dir.file(tag),
                                  "--resume", dir.file("whole/checkpoints/step-6"), "--set", "training.max_steps=9"};
    for (const std::string& k : kv) {
      args.push_back("--set");
      args.push_back(k);
    }
    const auto again = test::cohort(args);
    ASSERT_EQ(again.exitCode, 0) << tag << ": " << again.describe();
    EXPECT_NE(log(tag, 0).find("(written by no pipeline, distribution.tensor 2) in no pipeline"), std::string::npos)
        << log(tag, 0);
    EXPECT_LT(test::maxDifference(whole, ckpt::readStateDict(dir.file(tag + "/model/final.pt"))), kTolerance) << tag;
  }
  // And the other way: a run of one rank, resumed at T = 2 x R = 2 at ZeRO
  // stage 1, ends where it would have.
  const std::vector<std::string> one = {"checkpoint.every_steps=3", "checkpoint.when_behind=wait",
                                        "training.max_steps=9"};
  auto single = gpt("single", 1, 8, one);
  const auto split = test::cohort({"run", dir.file("single.yaml"), "--procs", "4", "--run-dir", dir.file("split"),
                                   "--resume", dir.file("single/checkpoints/step-6"), "--set", "training.batch_size=4",
                                   "--set", "training.max_steps=9", "--set", "distribution.tensor=2", "--set",
                                   "distribution.zero=1"});
  ASSERT_EQ(split.exitCode, 0) << split.describe();
  EXPECT_NE(log("split", 0).find("in no pipeline, distribution.tensor 2"), std::string::npos) << log("split", 0);
  EXPECT_LT(test::maxDifference(single, ckpt::readStateDict(dir.file("split/model/final.pt"))), kTolerance);
  // R = 2 at ZeRO 1 resumed at T = 2 x P = 2 (ZeRO 1 within the stages'
  // slices): each stage's slices and their optimizer state from the
  // replicas' parts.
  auto replicas = gpt("r2-zero1", 2, 4, {"distribution.zero=1", "checkpoint.every_steps=3",
                                         "checkpoint.when_behind=wait", "training.max_steps=9"});
  const auto staged2 = test::cohort({"run", dir.file("r2-zero1.yaml"), "--procs", "4", "--run-dir", dir.file("t2p2"),
                                     "--resume", dir.file("r2-zero1/checkpoints/step-6"), "--set",
                                     "training.batch_size=4", "--set", "training.max_steps=9", "--set",
                                     "distribution.tensor=2", "--set", "distribution.pipeline.stages=2", "--set",
                                     "distribution.pipeline.micro_batches=2", "--set", "distribution.zero=1"});
  ASSERT_EQ(staged2.exitCode, 0) << staged2.describe();
  EXPECT_LT(test::maxDifference(replicas, ckpt::readStateDict(dir.file("t2p2/model/final.pt"))), kTolerance);
  // And into 2 replicas of split stages at ZeRO stage 3 (8 ranks, 2
  // micro-batches of 2 each): each stage's slices sharded between them.
  const auto staged3 = test::cohort({"run", dir.file("r2-zero1.yaml"), "--procs", "8", "--run-dir",
                                     dir.file("t2p2r2-zero3"), "--resume", dir.file("r2-zero1/checkpoints/step-6"),
                                     "--set", "training.batch_size=2", "--set", "training.max_steps=9", "--set",
                                     "distribution.tensor=2", "--set", "distribution.pipeline.stages=2", "--set",
                                     "distribution.pipeline.micro_batches=2", "--set", "distribution.zero=3"});
  ASSERT_EQ(staged3.exitCode, 0) << staged3.describe();
  const double d3 = test::maxDifference(replicas, ckpt::readStateDict(dir.file("t2p2r2-zero3/model/final.pt")));
  EXPECT_LT(d3, kTolerance);
  RecordProperty("max_difference_r2_zero1_to_t2p2r2_zero3", fmt::format("{:.3g}", d3));
  // T = 2 resumed at R = 2 at ZeRO stage 3: each unit put together from
  // the slices' files and cut into this rank's part, one at a time.
  const auto zero3 = test::cohort({"run", dir.file("whole.yaml"), "--procs", "2", "--run-dir", dir.file("r2-zero3"),
                                   "--resume", dir.file("whole/checkpoints/step-6"), "--set", "training.batch_size=4",
                                   "--set", "training.max_steps=9", "--set", "distribution.zero=3"});
  ASSERT_EQ(zero3.exitCode, 0) << zero3.describe();
  EXPECT_LT(test::maxDifference(whole, ckpt::readStateDict(dir.file("r2-zero3/model/final.pt"))), kTolerance);
}

TEST_F(TensorJob, BadSettingsExit2NamingTheKey) {
  gpt("base", 1, 8, {"training.max_steps=1"});
  struct Bad {
    std::vector<std::string> kv;
    const char* procs;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {{"distribution.tensor=3"}, "3", "distribution.tensor: 3 ranks cannot split the model: model.n_head (4)"},
      {{"distribution.tensor=2", "model.vocab_size=257"}, "2", "model.vocab_size (257) is not divisible by 2"},
      {{"distribution.tensor=2"}, "3", "distribution.tensor: 2 tensor ranks x 1 pipeline stages do not divide"},
      {{"distribution.sequence_parallel=true"}, "1", "distribution.sequence_parallel"},
      {{"distribution.tensor=2", "model.lora.rank=4"}, "2", "model.lora.rank"},
      {{"distribution.tensor=2", "distribution.pipeline.stages=2", "distribution.sequence_parallel=true"}, "4",
       "distribution.sequence_parallel: sequence parallelism within pipeline stages"},
      {{"distribution.tensor=2", "model.dropout=0.1"}, "2", "model.dropout"},
      {{"distribution.tensor=2", "training.label_smoothing=0.1"}, "2", "training.label_smoothing"},
  };
  for (const Bad& b : bad) {
    std::vector<std::string> args{"run", dir.file("base.yaml"), "--procs", b.procs, "--run-dir", dir.file("bad")};
    for (const auto& k : b.kv) {
      args.push_back("--set");
      args.push_back(k);
    }
    const auto r = test::cohort(args);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE((r.out + r.err).find(b.says), std::string::npos) << b.says << "\n" << r.describe();
  }
  // A model that is not split.
  test::writeText(dir.file("cnn.yaml"), test::tinyJobYaml("cnn"));
  const auto cnn = test::cohort({"run", dir.file("cnn.yaml"), "--procs", "2", "--run-dir", dir.file("cnn"), "--set",
                                 "distribution.tensor=2"});
  EXPECT_EQ(cnn.exitCode, 2) << cnn.describe();
  EXPECT_NE(cnn.err.find("distribution.tensor: 2 ranks split each layer of the gpt and llama models only; model.arch "
                         "simple_cnn is not split"),
            std::string::npos)
      << cnn.describe();
}

}  // namespace cohort::tensor_job_test
