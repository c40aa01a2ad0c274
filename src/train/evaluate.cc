#include "train/detail/evaluate.h"

#include <torch/torch.h>

#include <algorithm>

#include "cohort/train/precision.h"

namespace cohort::train::detail {

monitor::EvalRecord evaluate(models::Model& model, data::BatchLoader& loader,
                             const data::DistributedSampler& sampler, const comm::Comm& comm,
                             int64_t numClasses, Precision precision) {
  torch::NoGradGuard noGrad;
  model.eval();
  loader.startEpoch(sampler.indices(0), 0);
  const int64_t k = std::min<int64_t>(5, numClasses);
  double lossSum = 0, correct1 = 0, correct5 = 0, count = 0;
  const c10::Device device = comm.device;
  while (auto batch = loader.next()) {
    const at::Tensor labels = batch->labels.to(device);
    at::Tensor logits;
    {
      AutocastScope autocast(precision, device);
      logits = model.forward(batch->images.to(device));
    }
    logits = logits.to(at::kFloat);
    lossSum += torch::nn::functional::cross_entropy(
                   logits, labels,
                   torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                   .item<double>();
    at::Tensor top = std::get<1>(logits.topk(k, 1));
    at::Tensor hits = top.eq(labels.unsqueeze(1));
    correct1 += hits.select(1, 0).sum().item<double>();
    correct5 += hits.any(1).sum().item<double>();
    count += static_cast<double>(batch->labels.size(0));
  }
  at::Tensor sums = torch::tensor({lossSum, correct1, correct5, count}, torch::kFloat64);
  comm::allreduceSum(comm, sums, "evaluation results");
  auto s = sums.accessor<double, 1>();
  monitor::EvalRecord r;
  r.samples = static_cast<int64_t>(s[3]);
  if (r.samples > 0) {
    r.loss = s[0] / s[3];
    r.top1 = s[1] / s[3];
    r.top5 = s[2] / s[3];
  }
  return r;
}

}  // namespace cohort::train::detail
