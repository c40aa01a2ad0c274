// The model's keys against each other and against its parallel layout:
// validate()'s share that concerns the model (config/detail/model_checks.h).

#include <fmt/format.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "config/detail/model_checks.h"

namespace cohort::detail {

// distribution.tensor and sequence_parallel against the model and the
// other settings (docs/parallelism.md, "Tensor parallelism").
void checkTensor(const JobConfig& job, const Where& where) {
  const DistributionConfig& d = job.distribution;
  const std::string key = "distribution.tensor";
  if (d.tensor == 1) {
    if (d.sequenceParallel) {
      fail(where("distribution.sequence_parallel"), "distribution.sequence_parallel",
           "is for tensor parallelism: set distribution.tensor > 1 too");
    }
    return;
  }
  const ModelConfig& m = job.model;
  if (m.arch != ModelArch::gpt && m.arch != ModelArch::llama) {
    fail(where(key), key,
         fmt::format("{} ranks split each layer of the gpt and llama models only; model.arch {} is not split "
                     "(use distribution.tensor 1)",
                     d.tensor, choiceName(m.arch)));
  }
  // What each rank holds 1/T of: the GPT's heads and MLP; Llama's
  // key/value heads (and so its query heads) and MLP (models::llamaOptions'
  // default width when unset); the vocabulary.
  const bool llama = m.arch == ModelArch::llama;
  const std::vector<std::pair<int64_t, std::string>> cut =
      llama ? std::vector<std::pair<int64_t, std::string>>{
                  {kvHeads(m),
                   m.nKvHead > 0 ? "model.n_kv_head" : "model.n_kv_head (unset: model.n_head)"},
                  {intermediateWidth(m),
                   m.intermediateSize > 0 ? "model.intermediate_size" : "model.intermediate_size (unset: 8/3 model.n_embd)"},
                  {m.vocabSize, "model.vocab_size"}}
            : std::vector<std::pair<int64_t, std::string>>{{m.nHead, "model.n_head"},
                                                           {4 * m.nEmbd, "the MLP's width (4 x model.n_embd)"},
                                                           {m.vocabSize, "model.vocab_size"}};
  for (const auto& [value, what] : cut) {
    if (value % d.tensor != 0) {
      fail(where(key), key,
           fmt::format("{} ranks cannot split the model: {} ({}) is not divisible by {}", d.tensor, what,
                       value, d.tensor));
    }
  }
  // What does not run split yet, each refused by its own key.
  const std::vector<std::tuple<bool, std::string, std::string>> refused = {
      {d.pipeline.stages > 1 && d.sequenceParallel, "distribution.sequence_parallel",
       "sequence parallelism within pipeline stages is not supported yet (the activations pass "
       "between the stages whole): use false with distribution.pipeline.stages > 1"},
      {m.lora.rank > 0, "model.lora.rank", "LoRA adapters are not split: train them with distribution.tensor 1"},
      {m.dropout != 0, "model.dropout", "only 0 is supported with tensor parallelism so far"},
      {!m.initFrom.empty(), "model.init_from",
       "a tensor-parallel job starts from random weights or its own checkpoints so far"},
      {job.training.labelSmoothing != 0, "training.label_smoothing",
       "the vocab-parallel cross-entropy has no label smoothing: use 0 with distribution.tensor > 1"}};
  for (const auto& [bad, path, why] : refused) {
    if (bad) fail(where(path), path, fmt::format("{} (distribution.tensor is {})", why, d.tensor));
  }
}

// distribution.pipeline against the model and the ranks (docs/parallelism.md).
void checkPipeline(const JobConfig& job, const Where& where) {
  const PipelineConfig& p = job.distribution.pipeline;
  const std::string stagesKey = "distribution.pipeline.stages";
  if (p.stages == 1) {
    for (auto [set, key] : {std::pair<bool, const char*>{p.microBatches > 0, "micro_batches"},
                            {!p.split.automatic(), "split"}}) {
      const std::string path = std::string("distribution.pipeline.") + key;
      if (set) fail(where(path), path, "is for a pipeline: set distribution.pipeline.stages > 1 too");
    }
    return;
  }
  const ModelArch arch = job.model.arch;
  const int64_t blocks = pipelineBlocks(job.model);
  if (blocks == 0) {
    fail(where(stagesKey), stagesKey,
         fmt::format("model.arch {} cannot be split into stages: the pipeline splits gpt by its "
                     "transformer blocks and the ResNets by their layer groups",
                     choiceName(arch)));
  }
  if (job.model.lora.rank > 0) {
    fail(where("model.lora.rank"), "model.lora.rank",
         fmt::format("LoRA does not run in a pipeline (distribution.pipeline.stages {}); train the "
                     "adapters with stages 1",
                     p.stages));
  }
  const std::string what = decoderArch(arch) ? "transformer blocks (model.n_layer)" : "layer groups";
  if (p.stages > blocks) {
    fail(where(stagesKey), stagesKey,
         fmt::format("{} stages, but the model has only {} {}: each stage needs at least one",
                     p.stages, blocks, what));
  }
  if (p.microBatchCount() < p.stages) {
    const std::string key = "distribution.pipeline.micro_batches";
    fail(where(key), key,
         fmt::format("{} micro-batches cannot fill {} stages: use at least {} (4 x stages keeps the "
                     "pipeline's idle time near 20%)",
                     p.microBatchCount(), p.stages, p.stages));
  }
  if (!p.split.automatic()) {
    const std::string key = "distribution.pipeline.split";
    int64_t sum = 0;
    for (int64_t b : p.split.blocks) sum += b;
    if (static_cast<int64_t>(p.split.blocks.size()) != p.stages || sum != blocks) {
      fail(where(key), key,
           fmt::format("[{}] gives {} stages {} {} of the model's {}; it must give each of the {} "
                       "stages its blocks, {} in all",
                       fmt::join(p.split.blocks, ", "), p.split.blocks.size(),
                       static_cast<int64_t>(p.split.blocks.size()) == p.stages ? "covering" : "with",
                       sum, blocks, p.stages, blocks));
    }
  }
}

void checkModelSizes(const JobConfig& job, const Where& where) {
  const ModelArch arch = job.model.arch;
  if (decoderArch(arch) && job.model.nEmbd % job.model.nHead != 0) {
    fail(where("model.n_embd"), "model.n_embd",
         fmt::format("{} is not divisible by model.n_head ({})", job.model.nEmbd, job.model.nHead));
  }
  if (arch == ModelArch::llama) {
    const ModelConfig& m = job.model;
    if ((m.nEmbd / m.nHead) % 2 != 0) {
      fail(where("model.n_embd"), "model.n_embd",
           fmt::format("{} / model.n_head ({}) is an odd head width; the rotary embedding turns pairs of "
                       "dimensions",
                       m.nEmbd, m.nHead));
    }
    if (m.nKvHead > 0 && m.nHead % m.nKvHead != 0) {
      fail(where("model.n_kv_head"), "model.n_kv_head",
           fmt::format("{} does not divide model.n_head ({}): each key/value head serves a group of query heads",
                       m.nKvHead, m.nHead));
    }
    if (m.rope.scaling == RopeScaling::llama3 && !(m.rope.highFreqFactor > m.rope.lowFreqFactor)) {
      fail(where("model.rope.high_freq_factor"), "model.rope.high_freq_factor",
           fmt::format("{} must be above model.rope.low_freq_factor ({})", m.rope.highFreqFactor,
                       m.rope.lowFreqFactor));
    }
  }
  {
    const ModelConfig d;
    const ModelConfig& m = job.model;
    const std::vector<std::tuple<bool, const char*, const char*>> keys = {
        {arch != ModelArch::llama && m.nKvHead != d.nKvHead, "model.n_kv_head", "llama"},
        {arch != ModelArch::llama && m.tieEmbeddings != d.tieEmbeddings, "model.tie_embeddings", "llama"},
        {arch != ModelArch::llama && arch != ModelArch::bert && m.intermediateSize != d.intermediateSize,
         "model.intermediate_size", "llama or bert"},
        {arch != ModelArch::llama && arch != ModelArch::bert && m.normEps != d.normEps, "model.norm_eps",
         "llama or bert"},
        {arch != ModelArch::bert && m.task != d.task, "model.task", "bert"}};
    for (const auto& [set, key, what] : keys) {
      if (set) fail(where(key), key, fmt::format("is for model.arch {}, not {}", what, choiceName(arch)));
    }
  }
  if (arch == ModelArch::bert && job.model.nEmbd % job.model.nHead != 0) {
    fail(where("model.n_embd"), "model.n_embd",
         fmt::format("{} is not divisible by model.n_head ({})", job.model.nEmbd, job.model.nHead));
  }

}

}  // namespace cohort::detail
