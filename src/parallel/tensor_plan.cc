// The plan of a model split over a tensor group (plan.h, tensorParallel):
// data parallelism among the ranks that hold the same slices, and what the
// split adds to it: the loss and evaluation read from the vocabulary's
// slices, the gradients of the tensors every rank holds whole counted once
// in the norm (and, with sequence parallelism, summed over the group), the
// whole model put together from the slices for the final save.

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>

#include "cohort/core/error.h"
#include "cohort/parallel/ddp.h"
#include "cohort/parallel/plan.h"
#include "cohort/parallel/tensor_model.h"
#include "cohort/parallel/tensor_layers.h"
#include "parallel/detail/tensor_split.h"

namespace cohort::parallel {
namespace {

class TensorPlan : public Plan {
 public:
  TensorPlan(Mesh mesh, std::shared_ptr<models::Model> model, DdpOptions options)
      : Plan(std::move(mesh), model, std::move(options)),
        split_(std::dynamic_pointer_cast<TensorParallelModel>(model)) {
    COHORT_ASSERT(split_ != nullptr, "a tensor-parallel plan over a model that is not split");
    COHORT_ASSERT(mesh_.stages == 1, "the tensor plan is for one stage; split stages are the pipeline's");
  }

  std::vector<double> runRound(const std::vector<at::Tensor>& inputs, bool exchange, MicroBatchOps& ops,
                               RoundTimes& times) override {
    const TensorExchanges before = tensorExchanges();
    std::vector<double> losses = Plan::runRound(inputs, exchange, ops, times);
    const TensorExchanges& after = tensorExchanges();
    carried_.sums += after.sums - before.sums;
    carried_.sumBytes += after.sumBytes - before.sumBytes;
    carried_.gathers += after.gathers - before.gathers;
    carried_.gatherBytes += after.gatherBytes - before.gatherBytes;
    ++rounds_;
    return losses;
  }

  nlohmann::json splitStats() const override {
    return {{"tensors", mesh_.tensors},
            {"sequence_parallel", split_->sequenceParallel()},
            {"rounds", rounds_},
            {"sums", carried_.sums},
            {"sum_bytes", carried_.sumBytes},
            {"gathers", carried_.gathers},
            {"gather_bytes", carried_.gatherBytes}};
  }

  void finishGradients() override {
    Plan::finishGradients();
    // Once the data group's exchange has finished.
    if (split_->sequenceParallel()) {
      detail::sumWholeGradients(engine_->optimizerParameters(), optimizerSlices(), mesh_.tensor);
    }
  }

  bool gradientsFinite() override {
    const bool finite = engine_->gradientsFinite();
    at::Tensor bad = torch::tensor({finite ? 0.0 : 1.0}, torch::kFloat64);
    comm::allreduceSum(mesh_.world, bad, "tensor-parallel gradient check");
    return bad.item<double>() == 0;
  }

  // Each rank adds the squares of the gradients it steps; a tensor every
  // rank of the group holds whole is counted 1/T on each. With ZeRO the
  // data group's ranks step disjoint parts; without it each holds them all
  // (so 1/replicas of each). One sum over the job.
  double gradientSquaredNorm() override {
    double sum = detail::splitSquares(engine_->optimizerParameters(), optimizerSlices(), mesh_.tensors);
    if (engine_->stats().zeroStage == 0) sum /= static_cast<double>(mesh_.replicas);
    at::Tensor total = torch::tensor({sum}, torch::kFloat64);
    comm::allreduceSum(mesh_.world, total, "tensor-parallel gradient norm");
    return total.item<double>();
  }

  at::Tensor outputLoss(const at::Tensor& output, const at::Tensor& labels, double labelSmoothing) override {
    COHORT_ASSERT(labelSmoothing == 0, "label smoothing with tensor parallelism");
    return detail::splitOutputLoss(*split_, output, labels);
  }

  OutputScore scoreOutput(const at::Tensor& output, const at::Tensor& labels) override {
    return detail::splitScoreOutput(*split_, mesh_, output, labels);
  }

  nlohmann::json tensorLayout() const override { return detail::splitLayout(*split_, mesh_); }

  // Replica 0's tensor group puts each split tensor together on its rank 0
  // (the job's rank 0), one tensor at a time.
  void visitCollected(const Publish& publish, const Visit& visit) override {
    if (mesh_.replica != 0) return;
    const bool root = mesh_.world.rank == 0;
    visitWholeTensors(publish(*model_), mesh_.tensor, [&](const std::string& name, const at::Tensor& t) {
      if (root) visit(name, t);
    });
  }

 private:
  std::shared_ptr<TensorParallelModel> split_;
  TensorExchanges carried_;  // by the training rounds' forward and backward
  int64_t rounds_ = 0;
};

}  // namespace

namespace detail {

double splitSquares(const std::vector<at::Tensor>& parts, const std::vector<std::vector<ckpt::PartSlice>>& slices,
                    int tensors) {
  torch::NoGradGuard noGrad;
  const double wholeShare = 1.0 / static_cast<double>(tensors);
  double sum = 0;
  for (size_t k = 0; k < parts.size() && k < slices.size(); ++k) {
    const at::Tensor g = parts[k].grad();
    if (!g.defined()) continue;
    for (const ckpt::PartSlice& s : slices[k]) {
      const at::Tensor run = g.reshape({-1}).narrow(0, s.at, s.length).to(at::kDouble);
      sum += (tensorCut(s.param).split() ? 1.0 : wholeShare) * run.dot(run).item<double>();
    }
  }
  return sum;
}

void sumWholeGradients(const std::vector<at::Tensor>& parts,
                       const std::vector<std::vector<ckpt::PartSlice>>& slices, const comm::Comm& group) {
  torch::NoGradGuard noGrad;
  std::vector<at::Tensor> runs;
  for (size_t k = 0; k < parts.size() && k < slices.size(); ++k) {
    at::Tensor g = parts[k].grad();
    if (!g.defined()) continue;
    for (const ckpt::PartSlice& s : slices[k]) {
      if (!tensorCut(s.param).split()) runs.push_back(g.reshape({-1}).narrow(0, s.at, s.length));
    }
  }
  if (runs.empty() || group.worldSize == 1) return;
  at::Tensor all = torch::cat(runs);
  comm::allreduceSum(group, all, "sequence-parallel gradient sum of the whole tensors");
  int64_t at = 0;
  for (at::Tensor& r : runs) {
    r.copy_(all.narrow(0, at, r.numel()));
    at += r.numel();
  }
}

at::Tensor splitOutputLoss(TensorParallelModel& model, const at::Tensor& output, const at::Tensor& labels) {
  return model.loss(output.to(at::kFloat), labels);
}

OutputScore splitScoreOutput(TensorParallelModel& model, const Mesh& mesh, const at::Tensor& output,
                             const at::Tensor& labels) {
  torch::NoGradGuard noGrad;
  const at::Tensor logits = output.to(at::kFloat).flatten(0, output.dim() - 2);
  const at::Tensor flat = labels.flatten();
  const int64_t n = flat.size(0);
  const double mean = model.loss(logits, flat).item<double>();
  const int64_t k = std::min<int64_t>(5, logits.size(1));
  auto [values, ids] = logits.topk(k, 1);
  // Vocabulary ids as float32: exact below 2^24.
  const at::Tensor allValues = gatherSequence(values.contiguous(), 1, mesh.tensor);
  const at::Tensor allIds = gatherSequence((ids + model.vocabFirst()).to(at::kFloat).contiguous(), 1, mesh.tensor);
  OutputScore s;
  if (mesh.tensorRank != 0) return s;
  const int64_t top = std::min<int64_t>(5, allValues.size(1));
  const at::Tensor best = allIds.gather(1, std::get<1>(allValues.topk(top, 1))).to(at::kLong);
  const at::Tensor hits = best.eq(flat.unsqueeze(1));
  s.lossSum = mean * static_cast<double>(n);
  s.top1 = hits.select(1, 0).sum().item<double>();
  s.top5 = hits.any(1).sum().item<double>();
  s.count = static_cast<double>(n);
  return s;
}

nlohmann::json splitLayout(const TensorParallelModel& model, const Mesh& mesh) {
  nlohmann::json cuts = nlohmann::json::object();
  for (const auto& [name, cut] : model.wholeCuts()) cuts[name] = {{"dim", cut.dim}, {"blocks", cut.blocks}};
  return {{"tensors", mesh.tensors}, {"sequence_parallel", model.sequenceParallel()}, {"cuts", std::move(cuts)}};
}

}  // namespace detail

std::unique_ptr<Plan> tensorParallel(Mesh mesh, std::shared_ptr<models::Model> model, DdpOptions options) {
  return std::make_unique<TensorPlan>(std::move(mesh), std::move(model), std::move(options));
}

}  // namespace cohort::parallel
