#include "cohort/infer/generate.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include "cohort/ckpt/manifest.h"
#include "cohort/ckpt/resume.h"
#include "cohort/ckpt/stage_tensors.h"
#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/weights.h"
#include "cohort/config/load.h"
#include "cohort/core/error.h"
#include "cohort/core/run_dir.h"
#include "cohort/infer/weights.h"
#include "cohort/data/shard_source.h"
#include "cohort/data/tokens.h"
#include "cohort/models/lora.h"
#include "cohort/models/model.h"
#include "cohort/storage/storage.h"

namespace cohort::infer {

namespace fs = std::filesystem;

int generateCommand(const GenerateOptions& o, std::ostream& out) {
  if (o.tokens < 0) throw UsageError(fmt::format("--tokens: must be >= 0, got {}", o.tokens));
  checkSampling(o.sampling, "--");
  const RunDir runDir{o.runDir};
  std::error_code ec;
  if (!fs::is_regular_file(runDir.jobFile(), ec)) {
    throw UsageError(fmt::format("{}: not a run directory (no job.yaml)", o.runDir));
  }
  const JobConfig job = loadJob(runDir.jobFile());
  if (!tokenModel(job) || maskedLm(job)) {
    throw UsageError(fmt::format("{}: model.arch is {} on {} data; generate needs a language model that predicts "
                                 "the next token (gpt, llama, or torchscript on tokens)",
                                 runDir.jobFile(), choiceName(job.model.arch),
                                 choiceName(job.data.train.kind)));
  }
  // The tokenizer is the training data's.
  CacheConfig noCache;
  noCache.enabled = false;
  const data::ShardSource source(job.data.train.path, storage::storageOptions(job.storage), noCache);
  const data::DatasetManifest& m = source.manifest();
  const auto tokenizer = data::datasetTokenizer(source);

  torch::InferenceMode inference;
  ModelConfig mc = job.model;
  if (mc.vocabSize == 0) mc.vocabSize = m.vocabSize;
  std::shared_ptr<models::Model> model = o.model;
  std::string weights = o.modelWeights;
  if (model == nullptr) {
    model = models::createModel(mc, {});
    weights = loadTrainedWeights(*model, job, runDir);
  }
  model->eval();
  const bool cached = o.kvCache && model->decodes();
  std::cerr << "cohort generate: weights from " << weights
            << (cached ? "" : o.kvCache ? " (no key/value cache: this model does not keep one)" : " (no key/value cache)")
            << "\n";

  const std::string prompt = o.prompt.empty() ? std::string("\n") : o.prompt;
  std::vector<int64_t> promptIds = tokenizer->encode(prompt);
  if (promptIds.empty()) {
    throw UsageError(fmt::format("--prompt: '{}' encodes to no tokens with the training data's tokenizer", prompt));
  }
  Sequence seq(std::move(promptIds), job.model.blockSize, cached);
  const size_t promptTokens = seq.tokens().size();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.sampling.seed);
  // Only ids the tokenizer can decode (model.vocab_size may be larger).
  const int64_t vocab = std::min<int64_t>(m.vocabSize, mc.vocabSize);
  out << prompt << std::flush;
  std::string text;    // the completion's
  size_t written = 0;  // of it, on `out`
  const auto start = std::chrono::steady_clock::now();
  double firstTokenS = 0;
  for (int64_t i = 0; i < o.tokens; ++i) {
    const at::Tensor logits = nextLogits(*model, seq).narrow(0, 0, vocab);
    seq.append(sampleNext(logits, o.sampling, generator));
    if (i == 0) firstTokenS = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    text = tokenizer->decode({seq.tokens().begin() + static_cast<std::ptrdiff_t>(promptTokens), seq.tokens().end()});
    const size_t stop = findStop(text, o.stops);
    if (stop != std::string::npos) {
      text.resize(stop);
      break;
    }
    const size_t ready = text.size() - stopPrefix(text, o.stops);
    if (ready > written) {
      out.write(text.data() + written, static_cast<std::streamsize>(ready - written)) << std::flush;
      written = ready;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (text.size() > written) out.write(text.data() + written, static_cast<std::streamsize>(text.size() - written));
  out << "\n";
  if (o.timing != nullptr) {
    const size_t generated = seq.tokens().size() - promptTokens;
    *o.timing << fmt::format("cohort generate: {} tokens in {:.3f} s: {:.1f} tokens/s; first token {:.1f} ms ({})\n",
                             generated, seconds, generated / std::max(seconds, 1e-9), firstTokenS * 1000,
                             cached ? "key/value cache" : "no cache");
  }
  return 0;
}

}  // namespace cohort::infer
