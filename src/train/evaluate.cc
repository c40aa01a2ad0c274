#include "train/detail/evaluate.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "cohort/train/precision.h"

namespace cohort::train::detail {

namespace {

// The forward of evaluation: this rank's part in `precision`.
class EvalOps : public parallel::MicroBatchOps {
 public:
  EvalOps(Precision precision, c10::Device device) : precision_(precision), device_(device) {}
  at::Tensor forward(models::Model& model, const at::Tensor& input, size_t) override {
    AutocastScope autocast(precision_, device_);
    return model.compute(input.to(device_));
  }
  Loss loss(const at::Tensor&, size_t) override { return {}; }

 private:
  Precision precision_;
  c10::Device device_;
};

}  // namespace

monitor::EvalRecord evaluate(parallel::Plan& plan, data::BatchLoader& loader,
                             const data::DistributedSampler& sampler, Precision precision) {
  torch::NoGradGuard noGrad;
  const comm::Comm& comm = plan.mesh().world;
  plan.model().eval();
  EvalOps ops(precision, comm.device);
  loader.startEpoch(sampler.indices(0), 0);
  double lossSum = 0, correct1 = 0, correct5 = 0, count = 0, samples = 0;
  bool perToken = false;
  const c10::Device device = comm.device;
  while (auto batch = loader.next()) {
    at::Tensor logits = plan.evalForward(batch->inputs, ops);
    if (!plan.holdsOutput()) continue;  // an earlier pipeline stage: passed on
    // Predictions [N, classes] against labels [N]: a language model's
    // [B, T, vocab] logits are B x T predictions.
    perToken = logits.dim() == 3;
    const parallel::OutputScore score = plan.scoreOutput(logits, batch->labels.to(device));
    lossSum += score.lossSum;
    correct1 += score.top1;
    correct5 += score.top5;
    count += score.count;
    // (Counted once per replica: a tensor group's other ranks count none.)
    if (score.count > 0) samples += static_cast<double>(batch->labels.size(0));
  }
  at::Tensor sums = torch::tensor({lossSum, correct1, correct5, count, samples}, torch::kFloat64);
  comm::allreduceSum(comm, sums, "evaluation results");
  auto s = sums.accessor<double, 1>();
  monitor::EvalRecord r;
  r.samples = static_cast<int64_t>(s[4]);
  if (s[3] > 0) {
    r.loss = s[0] / s[3];
    r.top1 = s[1] / s[3];
    r.top5 = s[2] / s[3];
  }
  // A rank without evaluation samples never saw the model's output; any
  // rank that did tells them all.
  at::Tensor lm = torch::tensor({perToken ? 1.0 : 0.0}, torch::kFloat64);
  comm::allreduceSum(comm, lm, "evaluation kind");
  if (lm.item<double>() > 0) {
    r.tokens = static_cast<int64_t>(s[3]);
    r.perplexity = std::exp(r.loss);
  }
  return r;
}

}  // namespace cohort::train::detail
