#include "parallel/detail/stage_link.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/comm/wait.h"
#include "cohort/core/error.h"
#include "cohort/core/time.h"

namespace cohort::parallel::detail {

namespace {

// Tags of the point-to-point messages between two stages; each direction
// of a pair carries one kind of message at a time, in order.
constexpr int kHeaderTag = 1;
constexpr int kActivationTag = 2;
constexpr int kGradientTag = 3;
constexpr int kTensorTag = 4;
// A sample's dimensions in a header: [count, sizes...].
constexpr int64_t kMaxDims = 8;

}  // namespace

StageLink::StageLink(const comm::Comm& pipeline) : comm_(pipeline) {}

StageLink::~StageLink() {
  // Never free what Gloo may still be reading.
  for (auto& [work, tensor] : pending_) {
    try {
      work->wait(comm_.timeout);
    } catch (...) {
    }
  }
}

std::string StageLink::describeStage(int stage) const {
  return fmt::format("stage {} (rank {})", stage, comm_.jobRank(stage));
}

void StageLink::post(at::Tensor t, int stage, int tag) {
  const auto start = SteadyClock::now();
  std::vector<at::Tensor> tensors{t};
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = comm_.pg->send(tensors, stage, tag);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: sending to pipeline {} failed: {}", comm_.jobRank(comm_.rank),
                                describeStage(stage), e.what()));
  }
  pending_.emplace_back(std::move(work), std::move(t));
  bytesSent += static_cast<int64_t>(pending_.back().second.nbytes());
  sendSeconds += secondsSince(start);
}

void StageLink::receive(at::Tensor& t, int stage, int tag, const std::string& what) {
  const auto start = SteadyClock::now();
  std::vector<at::Tensor> tensors{t};
  try {
    comm::wait(comm_.pg->recv(tensors, stage, tag), comm_, what.c_str());
  } catch (const CommError& e) {
    throw CommError(fmt::format("rank {}: {} from pipeline {} failed (the stage may have died): {}",
                                comm_.jobRank(comm_.rank), what, describeStage(stage), e.what()));
  }
  bytesReceived += static_cast<int64_t>(t.nbytes());
  recvSeconds += secondsSince(start);
}

void StageLink::sendActivation(const at::Tensor& y, int /*micro*/) {
  at::Tensor t = y.detach().to(at::kFloat).contiguous();
  const std::vector<int64_t> sample(t.sizes().begin() + 1, t.sizes().end());
  if (sentSample_.empty()) {
    COHORT_ASSERT(!sample.empty() && static_cast<int64_t>(sample.size()) < kMaxDims,
                  "activations of ", t.dim(), " dimensions");
    at::Tensor header = torch::zeros({kMaxDims}, torch::kLong);
    header[0] = static_cast<int64_t>(sample.size());
    for (size_t k = 0; k < sample.size(); ++k) header[static_cast<int64_t>(k) + 1] = sample[k];
    post(header, comm_.rank + 1, kHeaderTag);
    sentSample_ = sample;
  } else if (sample != sentSample_) {
    throw Error(fmt::format("pipeline stage {}: a micro-batch's activations are [{}] per sample, but "
                            "earlier ones were [{}]; a stage's output must keep its shape",
                            comm_.rank, fmt::join(sample, ", "), fmt::join(sentSample_, ", ")));
  }
  post(std::move(t), comm_.rank + 1, kActivationTag);
}

at::Tensor StageLink::recvActivation(int64_t batch, int micro) {
  const int from = comm_.rank - 1;
  if (sample_.empty()) {
    at::Tensor header = torch::zeros({kMaxDims}, torch::kLong);
    receive(header, from, kHeaderTag, "receiving the activations' shape");
    const int64_t dims = header[0].item<int64_t>();
    if (dims < 1 || dims >= kMaxDims) {
      throw CommError(fmt::format("pipeline stage {}: a header of {} dimensions from {}", comm_.rank,
                                  dims, describeStage(from)));
    }
    for (int64_t k = 0; k < dims; ++k) sample_.push_back(header[k + 1].item<int64_t>());
  }
  std::vector<int64_t> shape{batch};
  shape.insert(shape.end(), sample_.begin(), sample_.end());
  at::Tensor x = torch::empty(shape, torch::kFloat);
  receive(x, from, kActivationTag, fmt::format("receiving the activations of micro-batch {}", micro));
  return x;
}

void StageLink::sendGradient(const at::Tensor& g, int /*micro*/) {
  post(g.detach().to(at::kFloat).contiguous(), comm_.rank - 1, kGradientTag);
}

at::Tensor StageLink::recvGradient(at::IntArrayRef shape, int micro) {
  at::Tensor g = torch::empty(shape, torch::kFloat);
  receive(g, comm_.rank + 1, kGradientTag, fmt::format("receiving the gradients of micro-batch {}", micro));
  return g;
}

void StageLink::sendTensor(const at::Tensor& t, int stage) {
  post(t.detach().contiguous(), stage, kTensorTag);
}

void StageLink::recvTensor(at::Tensor& t, int stage) {
  receive(t, stage, kTensorTag, "receiving a stage's tensors for the final save");
}

void StageLink::drain() {
  const auto start = SteadyClock::now();
  auto pending = std::move(pending_);
  pending_.clear();
  for (auto& [work, tensor] : pending) {
    try {
      comm::wait(work, comm_, "sending to a neighbouring pipeline stage");
    } catch (const CommError& e) {
      throw CommError(fmt::format("rank {}: a send to a neighbouring pipeline stage failed (the "
                                  "stage may have died): {}",
                                  comm_.jobRank(comm_.rank), e.what()));
    }
  }
  sendSeconds += secondsSince(start);
}

}  // namespace cohort::parallel::detail
