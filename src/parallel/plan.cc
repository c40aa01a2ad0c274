#include "cohort/parallel/plan.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/ckpt/rank_state.h"
#include "cohort/core/error.h"
#include "cohort/parallel/ddp.h"
#include "cohort/models/lora.h"
#include "cohort/core/time.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/profiler.h"
#include "cohort/monitor/timeline.h"

namespace cohort::parallel {

Plan::Plan(Mesh mesh, std::shared_ptr<models::Model> model, DdpOptions options)
    : mesh_(std::move(mesh)), model_(std::move(model)) {
  COHORT_ASSERT(model_ != nullptr, "no model");
  engine_ = std::make_unique<DistributedDataParallel>(model_, mesh_.data, std::move(options));
}

Plan::~Plan() {
  // The unit runner is the engine's: never past its life.
  if (model_) model_->setUnitRunner(nullptr);
}

void Plan::start() {
  engine_->broadcastState();
  // Stage 3: the model runs each unit through the engine, which gathers
  // its parameters.
  model_->setUnitRunner(engine_->unitRunner());
}

std::vector<at::Tensor> Plan::optimizerParameters() const {
  if (engine_->stats().zeroStage > 0) return engine_->optimizerParameters();
  std::vector<at::Tensor> params;
  for (auto& [name, p] : models::trainableParameters(*model_)) params.push_back(p);
  return params;
}

std::vector<std::string> Plan::optimizerNames() const {
  std::vector<std::string> names;
  if (engine_->stats().zeroStage > 0) {
    // This rank's part of each bucket.
    const size_t parts = engine_->optimizerParameters().size();
    for (size_t k = 0; k < parts; ++k) names.push_back(fmt::format("part{}", k));
    return names;
  }
  for (auto& [name, p] : models::trainableParameters(*model_)) names.push_back(name);
  return names;
}

std::vector<double> Plan::runRound(const std::vector<at::Tensor>& inputs, bool exchange,
                                   MicroBatchOps& ops, RoundTimes& times) {
  // Data parallelism: a round is one micro-batch, as accumulation always ran.
  COHORT_ASSERT(inputs.size() == 1, "a data-parallel round holds one micro-batch, not ",
                inputs.size());
  engine_->setSyncGradients(exchange);
  const at::Tensor output = ops.forward(*model_, inputs[0], 0);
  const MicroBatchOps::Loss loss = ops.loss(output, 0);
  monitor::setPhase(monitor::Phase::backward);
  const double shmBefore = engine_->stats().sharedMemorySeconds;
  const auto start = SteadyClock::now();
  {
    monitor::TimelineSpan span("backward", "compute");
    monitor::ProfileRange range("backward");
    loss.backward.backward();
  }
  // ZeRO stages 2 and 3 exchange every micro-step (their full gradients are freed).
  if (!exchange) engine_->endMicroStep();
  // A shared-memory exchange runs inside backward: exposed communication,
  // not backward.
  const double shm = engine_->stats().sharedMemorySeconds - shmBefore;
  times.backward += secondsSince(start) - shm;
  times.exposedComm += shm;
  return {loss.value};
}

void Plan::finishGradients() { engine_->finishGradients(); }

bool Plan::gradientsFinite() { return engine_->gradientsFinite(); }

double Plan::gradientSquaredNorm() { return engine_->gradientSquaredNorm(); }

void Plan::scaleGradients(double factor) { engine_->scaleGradients(factor); }

void Plan::afterOptimizerStep() { engine_->gatherParameters(); }

void Plan::zeroGrad() { engine_->zeroGrad(); }

void Plan::syncBuffers() { engine_->syncBuffers(); }

at::Tensor Plan::evalForward(const at::Tensor& input, MicroBatchOps& ops) {
  return ops.forward(*model_, input, 0);
}

at::Tensor Plan::outputLoss(const at::Tensor& output, const at::Tensor& labels, double labelSmoothing) {
  namespace F = torch::nn::functional;
  return F::cross_entropy(output.to(at::kFloat).flatten(0, output.dim() - 2), labels.flatten(),
                          F::CrossEntropyFuncOptions().label_smoothing(labelSmoothing));
}

OutputScore Plan::scoreOutput(const at::Tensor& output, const at::Tensor& labels) {
  namespace F = torch::nn::functional;
  const at::Tensor logits = output.to(at::kFloat).flatten(0, output.dim() - 2);
  const at::Tensor flat = labels.flatten();
  OutputScore s;
  s.lossSum = F::cross_entropy(logits, flat, F::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
  const at::Tensor top = std::get<1>(logits.topk(std::min<int64_t>(5, logits.size(1)), 1));
  const at::Tensor hits = top.eq(flat.unsqueeze(1));
  s.top1 = hits.select(1, 0).sum().item<double>();
  s.top5 = hits.any(1).sum().item<double>();
  // Positions without a target (masked language modelling's unchosen
  // ones, labelled -100) are not counted.
  s.count = flat.ne(-100).sum().item<double>();
  return s;
}

std::string CheckpointRole::file(const std::string& name) const {
  return ckpt::sliceFile(slice, slices, ckpt::stageFile(stage, stages, name));
}

CheckpointRole Plan::checkpointRole() const {
  CheckpointRole role;
  role.stage = mesh_.stage;
  role.stages = mesh_.stages;
  role.slice = mesh_.tensorRank;
  role.slices = mesh_.tensors;
  role.dataRank = mesh_.replica;
  role.writesShared = mesh_.replica == 0;
  return role;
}

DdpStats Plan::stats() const { return engine_->stats(); }

nlohmann::json Plan::zeroLayout() const {
  const int stage = engine_->stats().zeroStage;
  if (stage == 0) return nullptr;
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [name, p] : models::trainableParameters(*model_)) {
    params[name] = {{"shape", p.sizes().vec()}, {"strides", p.strides().vec()}};
  }
  return {{"stage", stage},
          {"world_size", mesh_.replicas},
          {"buckets", engine_->bucketParameterNames()},
          {"params", std::move(params)}};
}

std::vector<std::vector<ckpt::PartSlice>> Plan::optimizerSlices() const {
  std::vector<std::vector<ckpt::PartSlice>> parts;
  for (const auto& slices : engine_->optimizerSlices()) {
    parts.emplace_back();
    for (const auto& s : slices) parts.back().push_back({s.param, s.offset, s.length, s.at});
  }
  return parts;
}

std::vector<std::string> Plan::parametersInParts() const {
  std::vector<std::string> names;
  if (engine_->stats().zeroStage < 3) return names;
  for (const auto& bucket : engine_->bucketParameterNames()) names.insert(names.end(), bucket.begin(), bucket.end());
  return names;
}

void Plan::gatherForSave() { engine_->gatherAllParameters(/*root=*/0); }

ckpt::StateDict Plan::collect(const Publish& publish) {
  ckpt::StateDict whole;
  visitCollected(publish, [&](const std::string& name, const at::Tensor& t) { whole.emplace_back(name, t); });
  return whole;
}

void Plan::visitCollected(const Publish& publish, const Visit& visit) {
  if (mesh_.world.rank != 0) return;
  for (const auto& [name, t] : publish(*model_)) visit(name, t);
}

void Plan::releaseParameters() { engine_->releaseParameters(); }

std::unique_ptr<Plan> dataParallel(Mesh mesh, std::shared_ptr<models::Model> model,
                                   DdpOptions options) {
  COHORT_ASSERT(mesh.stages == 1, "data parallelism over the whole model on a mesh of ",
                mesh.stages, " stages");
  return std::make_unique<Plan>(std::move(mesh), std::move(model), std::move(options));
}

}  // namespace cohort::parallel
