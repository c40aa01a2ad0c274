#include "plan/detail/split.h"

#include <fmt/format.h>

#include <algorithm>

#include "cohort/core/error.h"

namespace cohort::plan::detail {

namespace {

// A GPT's elements outside its blocks (token and position embeddings, the
// final norm) and in each block, from the model's shape and its measured
// total.
struct GptCount {
  double embedding = 0;  // the token embedding (the head too: tied)
  double outside = 0;    // all that is not in a block
  double block = 0;
};

GptCount countGpt(const Fit& fit, const ModelConfig& m) {
  GptCount c;
  const double e = double(m.nEmbd);
  // A block: the query/key/value, attention output and MLP weights (12 e^2)
  // with their biases (9 e) and two norms (4 e; without model.bias the
  // norms' weights only).
  c.block = 12 * e * e + (m.bias ? 13 * e : 2 * e);
  const double norm = m.bias ? 2 * e : e;
  // The vocabulary as given, else what the measured count leaves for it
  // (model.vocab_size 0: the data's tokenizer's).
  const double rest = fit.elements.trainable - double(m.nLayer) * c.block - double(m.blockSize) * e - norm;
  c.embedding = m.vocabSize > 0 ? double(m.vocabSize) * e : std::max(0.0, rest);
  c.outside = c.embedding + double(m.blockSize) * e + norm;
  return c;
}

// The vocabulary the count implies.
double vocabulary(const Fit& fit, const ModelConfig& m) {
  return m.vocabSize > 0 ? double(m.vocabSize) : countGpt(fit, m).embedding / double(std::max<int64_t>(1, m.nEmbd));
}

// The share of a block's activations a tensor split's rank holds
// (Megatron-LM's count of a layer's activations, per token and n_embd:
// 34 + 5 a s / h in all, of which 10 are the norms' and the residual's,
// held whole by every rank unless the sequence is split too).
double tensorActivationShare(const ModelConfig& m, int64_t t, bool sequenceParallel) {
  const double attention = 5.0 * double(m.nHead) * double(m.blockSize) / double(m.nEmbd);
  const double whole = 34 + attention;
  if (sequenceParallel) return 1.0 / double(t);
  return (10 + (24 + attention) / double(t)) / whole;
}

}  // namespace

std::vector<int64_t> stageBlocks(const JobConfig& job, int64_t stages) {
  const PipelineSplit& given = job.distribution.pipeline.split;
  if (static_cast<int64_t>(given.blocks.size()) == stages) return given.blocks;
  const int64_t n = job.model.nLayer;
  std::vector<int64_t> out;
  for (int64_t s = 0; s < stages; ++s) out.push_back(n / stages + (s < n % stages ? 1 : 0));
  return out;
}

std::vector<StageShare> stageShares(const Fit& fit, const JobConfig& job, const Setting& s) {
  const ModelConfig& m = job.model;
  if (m.arch != ModelArch::gpt) {
    throw ConfigError(fmt::format("cohort plan models a split (pipeline stages, a tensor split) of gpt only, not "
                                  "model.arch {}",
                                  choiceName(m.arch)));
  }
  const GptCount c = countGpt(fit, m);
  const double t = double(s.tensor);
  // A block's slices: every weight and bias but the norms' and the two
  // row-parallel biases (whole on every rank) cut in T.
  const double small = 6.0 * double(m.nEmbd);
  const double blockHere = s.tensor > 1 ? (c.block - small) / t + small : c.block;
  const double embeddingHere = c.embedding / t;  // vocabulary-parallel
  const double wholeCompute = double(m.nLayer) * c.block + c.embedding;  // the head's matmul counts, the lookup not
  // Activations: a block's per token against the head's logits (and their
  // softmax), float32; the measured whole-model figure is shared out so.
  const double perBlock = double(m.blockSize) * double(m.nEmbd) *
                          (34 + 5.0 * double(m.nHead) * double(m.blockSize) / double(m.nEmbd)) * 2;
  const double head = double(m.blockSize) * vocabulary(fit, m) * 4 * 3;
  const double wholeActivations = double(m.nLayer) * perBlock + head;
  const std::vector<int64_t> blocks = stageBlocks(job, s.stages);
  const double tensorShare = s.tensor > 1 ? tensorActivationShare(m, s.tensor, s.sequenceParallel) : 1.0;
  std::vector<StageShare> out;
  for (int64_t k = 0; k < s.stages; ++k) {
    StageShare st;
    st.blocks = blocks[static_cast<size_t>(k)];
    const bool first = k == 0, last = k + 1 == s.stages;
    double here = double(st.blocks) * blockHere;
    if (first) here += embeddingHere + double(m.blockSize) * double(m.nEmbd);
    if (last) here += 2 * double(m.nEmbd) + (first ? 0.0 : embeddingHere);  // the tied head
    st.elements.trainable = here;
    st.elements.buffers = fit.elements.buffers * double(st.blocks) / double(std::max<int64_t>(1, m.nLayer));
    // Stage 3 gathers a block at a time (and what no block holds, whole).
    const double outsideHere = here - double(st.blocks) * blockHere;
    st.elements.unit = 2 * blockHere + 2 * outsideHere;
    st.elements.unitWithFrozen = st.elements.unit;
    st.activationShare =
        (double(st.blocks) * perBlock * tensorShare + (last ? head / t : 0.0)) / wholeActivations;
    st.computeShare = (double(st.blocks) * c.block + (last ? c.embedding : 0.0)) / wholeCompute / t;
    st.inFlight = s.stages == 1 ? 1 : s.gpipe ? s.microBatches : std::min<int64_t>(s.microBatches, s.stages - k);
    // Two sums forward and two backward per block (and again when a
    // recomputed block runs its forward twice), of a token's n_embd floats.
    if (s.tensor > 1) {
      const double sums = s.recompute ? 6 : 4;
      st.tensorMbPerSample = sums * double(st.blocks) * double(m.blockSize) * double(m.nEmbd) * 4 / (1 << 20);
    }
    out.push_back(st);
  }
  return out;
}

}  // namespace cohort::plan::detail

namespace cohort::plan::detail {

namespace {
constexpr double kMb = 1 << 20;
}  // namespace

MemoryEstimate predictSplitMemory(const Fit& fit, const JobConfig& job, const Setting& s, double limitMb) {
  MemoryEstimate best;
  best.limitMb = limitMb;
  const std::vector<StageShare> stages = stageShares(fit, job, s);
  const bool byUnit = s.zero == 3 && s.tensor == 1;  // a tensor split builds its slices, then shards them
  const double perSample = s.recompute && fit.measuredRecompute ? fit.recomputeActivationMbPerSample
                                                                : fit.activationMbPerSample;
  for (const StageShare& st : stages) {
    MemoryEstimate m;
    m.limitMb = limitMb;
    m.state = train::stateBytes(st.elements, static_cast<int>(s.zero), static_cast<int>(s.replicas()),
                                job.training.optimizer, s.bucketCapMb, byUnit);
    m.baseMb = fit.baseMb;
    m.activationsMb = perSample * double(s.batchSize) * st.activationShare * double(st.inFlight) *
                      (s.tensor > 1 ? fit.tensorActivationFactor : 1.0);
    if (s.replicas() > 1) m.exchangeMb = fit.exchangeMbPerGradientMb * 4 * st.elements.trainable / kMb;
    if (s.stages > 1) m.exchangeMb += fit.pipelineExtraMb;
    m.peakMb = m.baseMb + m.state.total() / kMb + m.activationsMb + m.exchangeMb;
    best.stagePeakMb.push_back(m.peakMb);
    if (m.peakMb >= best.peakMb) {
      std::vector<double> peaks = std::move(best.stagePeakMb);
      best = m;
      best.stagePeakMb = std::move(peaks);
    }
  }
  if (s.stages == 1) best.stagePeakMb.clear();
  return best;
}

SpeedEstimate predictSplitSpeed(const Fit& fit, const JobConfig& job, const Setting& s) {
  SpeedEstimate e;
  const std::vector<StageShare> stages = stageShares(fit, job, s);
  const double threadScale = double(fit.threads) / double(std::max<int64_t>(1, s.threads));
  const double perSample =
      (s.recompute && fit.measuredRecompute ? fit.recomputeMsPerSample : fit.msPerSample) * threadScale;
  const double micro = perSample * double(s.batchSize);  // the whole model's micro-batch on one rank
  const double exchangeMsPerMb = fit.tensorExchangeMsPerMb > 0 ? fit.tensorExchangeMsPerMb : fit.localExchangeMsPerMb;
  // The slowest stage sets the pace of a pipeline: each round is M + P - 1
  // of its micro-batch times (the ramp up and down its idle share).
  double slowest = 0, tensorMs = 0, largest = 0;
  for (const StageShare& st : stages) {
    const double exchange = st.tensorMbPerSample * double(s.batchSize) * exchangeMsPerMb;
    if (micro * st.computeShare + exchange >= slowest) {
      slowest = micro * st.computeShare + exchange;
      tensorMs = exchange;
      e.tensorMbPerStep = st.tensorMbPerSample * double(s.batchSize);
    }
    largest = std::max(largest, st.elements.trainable);
  }
  const int64_t m = s.stages > 1 ? s.microBatches : 1;
  const double slots = double(s.accumulate) * double(m + s.stages - 1);
  const double optimizer = fit.msPerStep * threadScale * largest / std::max(1.0, fit.elements.trainable);
  double compute = slots * slowest + optimizer;
  if (s.procsPerNode > 1) compute *= fit.sharedMachineSlowdown;
  if (s.stages > 1) compute *= fit.pipelineFactor;
  e.computeMs = compute;
  e.tensorMbPerStep *= double(s.accumulate) * double(m);
  e.tensorExchangeMs = tensorMs * double(s.accumulate) * double(m);
  if (s.stages > 1) e.pipelineIdle = double(s.stages - 1) / double(m + s.stages - 1);
  // The data replicas' exchange of each stage's (slice's) gradients: on
  // the machine when replicas share it, between machines when they do not.
  const double grads = 4 * largest / kMb;
  const int64_t perNode = std::max<int64_t>(1, s.procsPerNode / (s.stages * s.tensor));
  const double volume = s.zero == 3 ? 1.5 : 1.0;
  if (perNode > 1) {
    const double p = double(perNode);
    e.localExchangeMs = fit.localExchangeMsPerMb * grads * volume * ((p - 1) / p) / 0.5;
  }
  if (s.nodes > 1 && s.replicas() > perNode) {
    const double n = double(s.replicas()) / double(perNode);
    const double bytes = volume * 2 * (n - 1) / n * grads * kMb;
    const double buckets = std::ceil(grads / std::max(1.0, s.bucketCapMb));
    const double messages = 2 * (n - 1) * buckets * volume;
    const double linkMs = bytes * 8 / (fit.link.gbps * 1e9) * 1e3 + messages * fit.link.latencyUs / 1e3;
    const double lastBucket = linkMs / std::max(1.0, buckets);
    e.linkExchangeMs = s.zero == 3 ? linkMs : std::max(lastBucket, linkMs - fit.backwardShare * slowest);
  }
  e.stepMs = e.computeMs + e.localExchangeMs + e.linkExchangeMs;
  e.samplesPerSecond = double(s.replicas() * s.batchSize * s.accumulate * m) / (e.stepMs / 1e3);
  // Against one rank training the replica's samples alone.
  e.efficiency = double(s.accumulate * m) * micro / (e.stepMs * double(s.stages * s.tensor));
  return e;
}

}  // namespace cohort::plan::detail

namespace cohort::plan::detail {

void calibrateSplit(Fit& fit, const JobConfig& job, const ProbeRun* tensor, const ProbeRun* pipeline) {
  std::vector<std::string> what;
  if (tensor != nullptr) {
    Fit bare = fit;
    bare.tensorExchangeMsPerMb = 1e-12;  // counted apart below
    const SpeedEstimate e = predictSplitSpeed(bare, job, tensor->setting);
    const MemoryEstimate m = predictSplitMemory(bare, job, tensor->setting, 0);
    // What the step took beyond the slices' compute: the sums, exposed.
    if (e.tensorMbPerStep > 0) fit.tensorExchangeMsPerMb = std::max(0.0, tensor->stepMs - e.stepMs) / e.tensorMbPerStep;
    if (m.activationsMb > 0) {
      const double held = tensor->peakRssMb - (m.peakMb - m.activationsMb);
      fit.tensorActivationFactor = std::clamp(held / m.activationsMb, 0.25, 4.0);
    }
    what.push_back(fmt::format("tensor {} on {} local ranks", tensor->setting.tensor, tensor->setting.procsPerNode));
  }
  if (pipeline != nullptr) {
    Fit bare = fit;
    bare.pipelineFactor = 1;
    bare.pipelineExtraMb = 0;
    const SpeedEstimate e = predictSplitSpeed(bare, job, pipeline->setting);
    if (e.stepMs > 0) fit.pipelineFactor = std::clamp(pipeline->stepMs / e.stepMs, 0.25, 4.0);
    // The probe's peak is its rank 0's: the first stage's.
    const MemoryEstimate m = predictSplitMemory(bare, job, pipeline->setting, 0);
    if (!m.stagePeakMb.empty()) fit.pipelineExtraMb = std::max(0.0, pipeline->peakRssMb - m.stagePeakMb.front());
    what.push_back(fmt::format("{} stages x {} micro-batches on {} local ranks", pipeline->setting.stages,
                               pipeline->setting.microBatches, pipeline->setting.procsPerNode));
  }
  fit.splitProbe = fmt::format("{}", fmt::join(what, "; "));
}

}  // namespace cohort::plan::detail
