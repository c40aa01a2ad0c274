// Tensor parallelism of model.arch llama in jobs, with real processes
// (docs/parallelism.md): a Llama of 4 query heads reading 2 key/value
// heads split over distribution.tensor ranks (T = 2, with sequence
// parallelism and recompute, T = 2 x R = 2 at ZeRO stage 3, T = 2 x P = 2,
// a tied head) ends with the parameters of one process with the global
// batch; its checkpoint records each split tensor's cut and resumes at T =
// 1 (and T = 1's at T = 2) where the run that kept its layout ended; sizes
// the ranks cannot split exit 2 naming the key.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "cohort/ckpt/state_dict.h"
#include "util/job_runs.h"
#include "util/jobs.h"
#include "util/process.h"
#include "util/runs.h"

namespace cohort::tensor_llama_job_test {

// As the GPT's (tensor_job_test.cc): 6 AdamW steps at lr 0.01 of sums
// grouped otherwise stay within about S x lr x 2^-12 = 1.46e-5. The tied
// head's split came closest: 9.5e-6 with attention's whole score matrix,
// 1.15e-5 with the blockwise kernel (models/flash_attention.h), whose
// rounding differs and is then grouped otherwise like the rest.
constexpr double kTolerance = 1.5e-5;

class TensorLlamaJob : public test::JobRuns {
 protected:
  void SetUp() override { tokenizeCorpus(); }

  // A Llama of 2 blocks, 4 heads of 4 reading 2 key/value heads, an MLP
  // of 32, an untied head, the bytes' 256 tokens, trained for 6 steps of
  // `batch` per rank on `procs` ranks with `kv` (--set) on top.
  ckpt::StateDict llama(const std::string& tag, int procs, int batch, std::vector<std::string> kv, int exitCode = 0) {
    const std::string yaml = test::tinyTokenJobYaml(
        tag, dir.file("tok/train"),
        "{arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 16, intermediate_size: 32, block_size: 12, "
        "vocab_size: 256}");
    return run(tag, yaml, procs, batch, std::move(kv), {}, exitCode);
  }

  // `tag`'s run resumed from `from` on `procs` ranks with `kv`: its final model.
  ckpt::StateDict resumed(const std::string& yamlOf, const std::string& tag, const std::string& from,
                          const std::string& procs, const std::vector<std::string>& kv) {
    std::vector<std::string> args{"run",    dir.file(yamlOf + ".yaml"), "--procs", procs, "--run-dir", dir.file(tag),
                                  "--resume", from};
    for (const std::string& k : kv) {
      args.push_back("--set");
      args.push_back(k);
    }
    const auto r = test::cohort(args);
    EXPECT_EQ(r.exitCode, 0) << tag << ": " << r.describe();
    if (r.exitCode != 0) return {};
    return ckpt::readStateDict(dir.file(tag + "/model/final.pt"));
  }
};

TEST_F(TensorLlamaJob, SplitLayersEqualOneProcessWithTheGlobalBatch) {
  // Global batch 8 everywhere.
  auto reference = llama("single", 1, 8, {});
  auto tiedReference = llama("single-tied", 1, 8, {"model.tie_embeddings=true"});
  ASSERT_FALSE(reference.empty());
  struct Variant {
    const char* tag;
    int procs;
    int batch;
    std::vector<std::string> kv;
    bool tied = false;
  };
  const std::vector<Variant> variants = {
      {"t2", 2, 8, {"distribution.tensor=2"}},
      {"t2-recompute-sp", 2, 8,
       {"distribution.tensor=2", "model.recompute=blocks", "distribution.sequence_parallel=true"}},
      {"t2-tied", 2, 8, {"distribution.tensor=2", "model.tie_embeddings=true"}, true},
      // Each block's slices sharded among the replicas.
      {"t2r2-zero3", 4, 4, {"distribution.tensor=2", "distribution.zero=3"}},
      // A pipeline of split stages, clipping over every stage's slices.
      {"t2p2", 4, 4,
       {"distribution.tensor=2", "distribution.pipeline.stages=2", "distribution.pipeline.micro_batches=2"}},
  };
  for (const Variant& v : variants) {
    auto run = llama(v.tag, v.procs, v.batch, v.kv);
    if (run.empty()) continue;
    const double diff = test::maxDifference(v.tied ? tiedReference : reference, run);
    EXPECT_LT(diff, kTolerance) << v.tag;
    RecordProperty(std::string("max_parameter_difference_") + v.tag, fmt::format("{:.3g}", diff));
    EXPECT_NE(log(v.tag, 0).find("x 2 tensor ranks; this rank is slice 0/2"), std::string::npos) << log(v.tag, 0);
  }
  // The comparison can fail: the tied head trains other weights.
  EXPECT_GT(test::maxDifference(reference, tiedReference), 100 * kTolerance);
  // Per step, as the GPT's: per block one sum after attention and one
  // after the MLP each way, the embedding's and the head's, the loss's 3.
  const auto split = summaryOf("t2")["tensor"];
  EXPECT_EQ(split["sums_per_step"], 4 * 2 + 2 + 3) << split.dump();
  EXPECT_GT(summaryOf("t2-recompute-sp")["tensor"]["gathers"].get<int64_t>(), 0);
  // Each rank holds about half of the model.
  const auto whole = summaryOf("single")["parameters"].get<int64_t>();
  const auto slice = summaryOf("t2")["parameters"].get<int64_t>();
  EXPECT_LT(slice, whole * 6 / 10) << "a rank of T = 2 holds " << slice << " of " << whole;
}

TEST_F(TensorLlamaJob, CheckpointsResumeInAnotherSplit) {
  const std::vector<std::string> kv = {"distribution.tensor=2", "checkpoint.every_steps=3",
                                       "checkpoint.when_behind=wait", "training.max_steps=9"};
  auto whole = llama("whole", 2, 8, kv);
  ASSERT_FALSE(whole.empty());
  // The manifest names each split tensor's cut: q, k and v separate
  // tensors, each one block, cut by rows; o_proj and down_proj by columns.
  const auto manifest = nlohmann::json::parse(test::readText(dir.file("whole/checkpoints/step-6/manifest.json")));
  const auto tensor = manifest["extra"]["tensor"];
  EXPECT_EQ(tensor["tensors"], 2) << tensor.dump();
  const auto cuts = tensor["cuts"];
  for (const char* rows : {"q_proj", "k_proj", "v_proj"}) {
    const auto cut = cuts[fmt::format("model.layers.1.self_attn.{}.weight", rows)];
    EXPECT_EQ(cut, (nlohmann::json{{"dim", 0}, {"blocks", 1}})) << rows << ": " << cuts.dump();
  }
  EXPECT_EQ(cuts["model.layers.0.mlp.down_proj.weight"]["dim"], 1) << cuts.dump();
  EXPECT_EQ(cuts["lm_head.weight"]["dim"], 0) << cuts.dump();
  EXPECT_FALSE(cuts.contains("model.layers.0.input_layernorm.weight")) << cuts.dump();

  // Step 6 of T = 2 goes on at T = 1 on one rank to where T = 2 ended.
  auto t1 = resumed("whole", "t1", dir.file("whole/checkpoints/step-6"), "1",
                    {"training.batch_size=8", "training.max_steps=9", "distribution.tensor=1"});
  EXPECT_NE(log("t1", 0).find("(written by no pipeline, distribution.tensor 2) in no pipeline"), std::string::npos)
      << log("t1", 0);
  if (!t1.empty()) {
    EXPECT_LT(test::maxDifference(whole, t1), kTolerance);
  }

  // And the other way: one rank's step 6 goes on at T = 2.
  auto single = llama("single", 1, 8, {"checkpoint.every_steps=3", "checkpoint.when_behind=wait",
                                      "training.max_steps=9"});
  auto t2 = resumed("single", "t2", dir.file("single/checkpoints/step-6"), "2",
                    {"training.batch_size=8", "training.max_steps=9", "distribution.tensor=2"});
  EXPECT_NE(log("t2", 0).find("in no pipeline, distribution.tensor 2"), std::string::npos) << log("t2", 0);
  if (!t2.empty()) {
    EXPECT_LT(test::maxDifference(single, t2), kTolerance);
  }
}

TEST_F(TensorLlamaJob, SizesTheRanksCannotSplitExit2NamingTheKey) {
  llama("base", 1, 8, {"training.max_steps=1"});
  struct Bad {
    std::vector<std::string> kv;
    const char* procs;
    const char* says;
  };
  const std::vector<Bad> bad = {
      {{"distribution.tensor=4"}, "4",
       "distribution.tensor: 4 ranks cannot split the model: model.n_kv_head (2) is not divisible by 4"},
      {{"distribution.tensor=2", "model.n_kv_head=1"}, "2", "model.n_kv_head (1) is not divisible by 2"},
      {{"distribution.tensor=2", "model.intermediate_size=33"}, "2",
       "model.intermediate_size (33) is not divisible by 2"},
      {{"distribution.tensor=2", "model.vocab_size=257"}, "2", "model.vocab_size (257) is not divisible by 2"},
      {{"distribution.tensor=2", "model.dropout=0.1"}, "2", "model.dropout"},
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
}

}  // namespace cohort::tensor_llama_job_test
