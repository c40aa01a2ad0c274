#include "cohort/parallel/pipeline.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "cohort/comm/wait.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/time.h"
#include "cohort/models/lora.h"
#include "cohort/parallel/ddp.h"
#include "cohort/monitor/activity.h"
#include "cohort/monitor/profiler.h"
#include "cohort/monitor/timeline.h"
#include "cohort/core/text.h"
#include "parallel/detail/stage_link.h"
#include "parallel/detail/tensor_split.h"

namespace cohort::parallel {

namespace {

// The tied tensors among `names` that this stage holds: only the first and
// the last stage hold them (the embedding, and the head that is the same
// matrix).
std::vector<std::pair<std::string, at::Tensor>> heldTied(const Mesh& mesh, const models::Model& stage,
                                                         const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, at::Tensor>> held;
  if (!mesh.firstStage() && !mesh.lastStage()) return held;
  for (const auto& p : stage.named_parameters()) {
    if (std::find(names.begin(), names.end(), p.key()) != names.end() && p.value().requires_grad()) {
      held.emplace_back(p.key(), p.value());
    }
  }
  return held;
}

DdpOptions excluding(DdpOptions options, const std::vector<std::pair<std::string, at::Tensor>>& tied) {
  for (const auto& [name, t] : tied) options.exclude.push_back(name);
  return options;
}


}  // namespace

Pipeline::Pipeline(Mesh mesh, std::shared_ptr<models::Model> stage, DdpOptions ddp, PipelineOptions options)
    : Plan(mesh, stage, excluding(ddp, heldTied(mesh, *stage, options.tied))),
      options_(std::move(options)),
      tied_(heldTied(mesh_, *model_, options_.tied)),
      split_(std::dynamic_pointer_cast<TensorParallelModel>(model_)) {
  COHORT_ASSERT(mesh_.tensors == 1 || split_ != nullptr, "a pipeline over a tensor group needs split stages");
  stats_.stage = mesh_.stage;
  stats_.stages = mesh_.stages;
  stats_.microBatches = options_.microBatches;
}

Pipeline::~Pipeline() = default;

void Pipeline::start() {
  Plan::start();
  detail::StageLinkOptions lo;
  lo.sharedMemory = options_.sharedMemory;
  lo.maxBatch = options_.maxBatch;
  // 1F1B has at most P micro-batches in flight between two stages.
  lo.slots = std::min(options_.microBatches, mesh_.stages) + 1;
  links_ = std::make_unique<detail::StageLink>(mesh_.pipeline, lo);
  // The tied tensors' gradients are summed over the first and last stage of
  // every replica: one group of all of them.
  if (!tied_.empty()) {
    std::vector<int> members;
    for (int r = 0; r < mesh_.replicas; ++r) {
      members.push_back(mesh_.jobRank(r, 0));
      members.push_back(mesh_.jobRank(r, mesh_.stages - 1));
    }
    std::sort(members.begin(), members.end());
    // One such group per tensor rank (its slices of the tied tensors).
    tiedGroup_ = comm::subgroup(mesh_.world,
                                mesh_.tensors > 1 ? fmt::format("pipeline-tied-{}", mesh_.tensorRank) : "pipeline-tied",
                                members);
    for (auto& [name, t] : tied_) {
      log::info("pipeline: {} is held by the first and the last stage; its gradient is summed "
                "between them",
                name);
    }
  }
}

std::vector<at::Tensor> Pipeline::optimizerParameters() const {
  std::vector<at::Tensor> params = Plan::optimizerParameters();
  // With ZeRO the engine's parts leave the tied tensors out: they are stepped whole.
  if (engine_->stats().zeroStage > 0) {
    for (const auto& [name, t] : tied_) params.push_back(t);
  }
  return params;
}

std::vector<std::string> Pipeline::optimizerNames() const {
  std::vector<std::string> names = Plan::optimizerNames();
  if (engine_->stats().zeroStage > 0) {
    for (const auto& [name, t] : tied_) names.push_back(name);
  }
  return names;
}

std::vector<std::vector<ckpt::PartSlice>> Pipeline::optimizerSlices() const {
  std::vector<std::vector<ckpt::PartSlice>> slices = Plan::optimizerSlices();
  if (engine_->stats().zeroStage > 0) {
    for (const auto& [name, t] : tied_) slices.push_back({ckpt::PartSlice{name, 0, t.numel(), 0}});
  }
  return slices;
}

std::vector<double> Pipeline::runRound(const std::vector<at::Tensor>& inputs, bool exchange,
                                       MicroBatchOps& ops, RoundTimes& times) {
  const int m = static_cast<int>(inputs.size());
  const bool first = mesh_.firstStage(), last = mesh_.lastStage();
  struct Held {
    at::Tensor x, y, loss;
  };
  std::vector<Held> held(static_cast<size_t>(m));
  std::vector<double> losses(static_cast<size_t>(m), 0.0);
  const double recvBefore = links_->recvSeconds, sendBefore = links_->sendSeconds;
  const auto start = SteadyClock::now();
  int holding = 0;
  for (const ScheduleStep& step : scheduleOf(options_.schedule, mesh_.stage, mesh_.stages, m)) {
    Held& h = held[static_cast<size_t>(step.micro)];
    const at::Tensor& input = inputs[static_cast<size_t>(step.micro)];
    if (step.forward) {
      if (first) {
        h.x = input;
      } else {
        monitor::setPhase(monitor::Phase::exchange);
        h.x = links_->recvActivation(input.size(0), step.micro);
        h.x.requires_grad_(true);
      }
      h.y = ops.forward(*model_, h.x, static_cast<size_t>(step.micro));
      if (last) {
        const MicroBatchOps::Loss loss = ops.loss(h.y, static_cast<size_t>(step.micro));
        h.loss = loss.backward;
        losses[static_cast<size_t>(step.micro)] = loss.value;
      } else {
        links_->sendActivation(h.y, step.micro);
      }
      stats_.heldPeak = std::max(stats_.heldPeak, ++holding);
      continue;
    }
    // The step's last backward exchanges the gradients (the hooks launch it).
    const bool sync = exchange && step.micro == m - 1;
    engine_->setSyncGradients(sync);
    at::Tensor from = h.loss, grad;
    if (!last) {
      monitor::setPhase(monitor::Phase::exchange);
      grad = links_->recvGradient(h.y.sizes(), step.micro).to(h.y.scalar_type());
      from = h.y;
    }
    monitor::setPhase(monitor::Phase::backward);
    const double shmBefore = engine_->stats().sharedMemorySeconds;
    const auto backwardStart = SteadyClock::now();
    {
      monitor::TimelineSpan span("backward", "compute");
      monitor::ProfileRange range("backward");
      if (grad.defined()) {
        from.backward(grad);
      } else {
        from.backward();
      }
    }
    if (!sync) engine_->endMicroStep();
    const double shm = engine_->stats().sharedMemorySeconds - shmBefore;
    times.backward += secondsSince(backwardStart) - shm;
    times.exposedComm += shm;
    if (!first) links_->sendGradient(h.x.grad(), step.micro);
    h = Held{};
    --holding;
  }
  links_->drain();
  // Every stage of the replica reports the losses: the last stage's. The
  // broadcast ends the round on every stage together: a stage that is done
  // waits here for the others to drain.
  const auto endStart = SteadyClock::now();
  at::Tensor values = torch::tensor(losses, torch::kFloat64);
  {
    std::vector<at::Tensor> tensors{values};
    c10d::BroadcastOptions o;
    o.rootRank = mesh_.stages - 1;
    comm::wait(mesh_.pipeline.pg->broadcast(tensors, o), mesh_.pipeline, "pipeline losses");
  }
  const double end = secondsSince(endStart);
  for (int i = 0; i < m; ++i) losses[static_cast<size_t>(i)] = values[i].item<double>();
  const double recv = links_->recvSeconds - recvBefore, send = links_->sendSeconds - sendBefore;
  times.waiting += recv + end;
  times.transfer += send;
  ++stats_.rounds;
  stats_.roundSeconds += secondsSince(start);
  stats_.recvSeconds += recv;
  stats_.endSeconds += end;
  stats_.sendSeconds += send;
  return losses;
}

void Pipeline::finishGradients() {
  engine_->finishGradients();
  if (tied_.empty()) return;
  torch::NoGradGuard noGrad;
  for (auto& [name, t] : tied_) {
    if (!t.grad().defined()) t.mutable_grad() = torch::zeros_like(t);
    at::Tensor g = t.mutable_grad();
    comm::allreduceSum(tiedGroup_, g, "tied embedding gradient (first and last pipeline stage)");
  }
}

bool Pipeline::gradientsFinite() {
  bool finite = engine_->gradientsFinite();
  for (const auto& [name, t] : tied_) finite = finite && torch::isfinite(t.grad()).all().item<bool>();
  // Every stage of the replica decides alike (a NaN loss on the last stage
  // need not reach every gradient of the first).
  at::Tensor bad = torch::tensor({finite ? 0.0 : 1.0}, torch::kFloat64);
  comm::allreduceSum(split_ ? mesh_.world : mesh_.pipeline, bad, "pipeline gradient check");
  return bad.item<double>() == 0;
}

double Pipeline::gradientSquaredNorm() {
  if (split_) {
    // Every rank's share of the whole model's (detail::splitSquares), the
    // tied slices counted on the first stage: one sum over the job.
    const double replicas = static_cast<double>(mesh_.replicas);
    double sum = detail::splitSquares(engine_->optimizerParameters(), Plan::optimizerSlices(), mesh_.tensors);
    if (engine_->stats().zeroStage == 0) sum /= replicas;
    if (mesh_.firstStage()) {
      for (const auto& [name, t] : tied_) sum += t.grad().to(at::kDouble).pow(2).sum().item<double>() / replicas;
    }
    at::Tensor total = torch::tensor({sum}, torch::kFloat64);
    comm::allreduceSum(mesh_.world, total, "pipeline gradient norm");
    return total.item<double>();
  }
  double sum = engine_->gradientSquaredNorm();
  // The tied tensors' gradient is the same on the first and the last stage: counted once.
  if (mesh_.firstStage()) {
    for (const auto& [name, t] : tied_) sum += t.grad().to(at::kDouble).pow(2).sum().item<double>();
  }
  at::Tensor total = torch::tensor({sum}, torch::kFloat64);
  comm::allreduceSum(mesh_.pipeline, total, "pipeline gradient norm");
  return total.item<double>();
}

void Pipeline::scaleGradients(double factor) {
  engine_->scaleGradients(factor);
  torch::NoGradGuard noGrad;
  for (auto& [name, t] : tied_) {
    if (t.grad().defined()) t.mutable_grad().mul_(factor);
  }
}

void Pipeline::zeroGrad() {
  engine_->zeroGrad();
  torch::NoGradGuard noGrad;
  for (auto& [name, t] : tied_) {
    if (t.grad().defined()) t.mutable_grad().zero_();
  }
}

at::Tensor Pipeline::evalForward(const at::Tensor& input, MicroBatchOps& ops) {
  const at::Tensor x = mesh_.firstStage() ? input : links_->recvActivation(input.size(0), 0);
  at::Tensor y = ops.forward(*model_, x, 0);
  if (mesh_.lastStage()) return y;
  links_->sendActivation(y, 0);
  links_->drain();
  return {};
}

void Pipeline::visitCollected(const Publish& publish, const Visit& visit) {
  const int64_t call = collects_++;
  // Replica 0's stages hold the model (gathered, at ZeRO stage 3); stage 0
  // there is the job's rank 0, which visits the stages' tensors in order,
  // each name once, one received tensor at a time. Split stages put each
  // split tensor together on their tensor rank 0 first, one at a time,
  // which passes it on.
  if (mesh_.replica != 0) return;
  const ckpt::StateDict mine = publish(*model_);
  const comm::Comm& pipe = mesh_.pipeline;
  auto key = [&](int stage) { return fmt::format("pipeline-collect/{}/{}", call, stage); };
  auto whole = [&](const std::string& name, const at::Tensor& t, const Visit& use) {
    if (mesh_.tensors == 1) {
      use(name, t);
    } else {
      visitWholeTensors(ckpt::StateDict{{name, t}}, mesh_.tensor, use);
    }
  };
  if (!mesh_.firstStage()) {
    if (mesh_.tensorRank == 0) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& [name, t] : mine) {
        std::vector<int64_t> shape = t.sizes().vec();
        const TensorCut cut = mesh_.tensors > 1 ? tensorCut(name) : TensorCut{};
        if (cut.split()) shape[static_cast<size_t>(cut.dim)] *= mesh_.tensors;
        list.push_back({{"name", name}, {"shape", shape}, {"dtype", static_cast<int>(t.scalar_type())}});
      }
      pipe.store->set(key(mesh_.stage), bytesOf(list.dump()));
    }
    for (const auto& [name, t] : mine) {
      whole(name, t, [&](const std::string&, const at::Tensor& w) { links_->sendTensor(w.detach().cpu().contiguous(), 0); });
    }
    links_->drain();
    return;
  }
  std::set<std::string> names;
  for (const auto& [name, t] : mine) {
    names.insert(name);
    whole(name, t, visit);
  }
  if (mesh_.tensorRank != 0) return;
  for (int s = 1; s < mesh_.stages; ++s) {
    std::vector<uint8_t> raw;
    try {
      pipe.store->wait({key(s)}, pipe.timeout);
      raw = pipe.store->get(key(s));
    } catch (const std::exception& e) {
      throw TimeoutError(fmt::format("rank 0: pipeline stage {} sent no list of its tensors for the "
                                     "final save within {} s: {}",
                                     s, pipe.timeout.count() / 1000.0, e.what()));
    }
    const nlohmann::json list = nlohmann::json::parse(std::string(raw.begin(), raw.end()));
    for (const auto& item : list) {
      at::Tensor t = torch::empty(item["shape"].get<std::vector<int64_t>>(),
                                  static_cast<at::ScalarType>(item["dtype"].get<int>()));
      links_->recvTensor(t, s);
      const std::string name = item["name"];
      if (names.insert(name).second) visit(name, t);
    }
  }
}

at::Tensor Pipeline::outputLoss(const at::Tensor& output, const at::Tensor& labels, double labelSmoothing) {
  if (!split_) return Plan::outputLoss(output, labels, labelSmoothing);
  COHORT_ASSERT(labelSmoothing == 0, "label smoothing with tensor parallelism");
  return detail::splitOutputLoss(*split_, output, labels);
}

OutputScore Pipeline::scoreOutput(const at::Tensor& output, const at::Tensor& labels) {
  return split_ ? detail::splitScoreOutput(*split_, mesh_, output, labels) : Plan::scoreOutput(output, labels);
}

nlohmann::json Pipeline::tensorLayout() const { return split_ ? detail::splitLayout(*split_, mesh_) : nullptr; }

PipelineStats Pipeline::stats() const {
  PipelineStats s = stats_;
  if (links_) {
    s.bytesSent = links_->bytesSent;
    s.bytesReceived = links_->bytesReceived;
  }
  return s;
}

int64_t Pipeline::tiedElements() const {
  int64_t n = 0;
  for (const auto& [name, t] : tied_) n += t.numel();
  return n;
}

std::unique_ptr<Plan> pipeline(Mesh mesh, std::shared_ptr<models::Model> stage, DdpOptions ddp,
                               PipelineOptions options) {
  COHORT_ASSERT(mesh.stages > 1, "a pipeline of ", mesh.stages, " stage");
  return std::make_unique<Pipeline>(std::move(mesh), std::move(stage), std::move(ddp), std::move(options));
}

}  // namespace cohort::parallel
