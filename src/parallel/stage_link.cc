#include "parallel/detail/stage_link.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/comm/wait.h"
#include "cohort/core/error.h"
#include "cohort/core/log.h"
#include "cohort/core/time.h"
#include "cohort/core/text.h"

#include <unistd.h>

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

std::string textOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

StageLink::StageLink(const comm::Comm& pipeline, StageLinkOptions options)
    : comm_(pipeline), options_(options) {
  comm_.store->set(fmt::format("link/machine/{}", comm_.rank),
                   bytesOf(comm::machineIdentity(comm_.jobRank(comm_.rank))));
}

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

bool StageLink::samePlace(int stage) {
  const std::string key = fmt::format("link/machine/{}", stage);
  try {
    comm_.store->wait({key}, comm_.timeout);
    return textOf(comm_.store->get(key)) == comm::machineIdentity(comm_.jobRank(comm_.rank));
  } catch (const std::exception& e) {
    throw TimeoutError(fmt::format("rank {}: pipeline {} published no machine identity within {} s: {}",
                                   comm_.jobRank(comm_.rank), describeStage(stage),
                                   comm_.timeout.count() / 1000.0, e.what()));
  }
}

void StageLink::decideOut(Way& way, const char* kind, int peer, const std::vector<int64_t>& sample) {
  way.decided = true;
  const std::string key = fmt::format("link/{}/{}", kind, comm_.rank);
  const size_t slotBytes = static_cast<size_t>(options_.maxBatch * elements(sample)) * sizeof(float);
  std::string why;
  std::string name;
  if (!options_.sharedMemory) {
    why = "distribution.shared_memory is false";
  } else if (options_.maxBatch <= 0) {
    why = "no batch size to size the slots";
  } else if (!samePlace(peer)) {
    why = "another machine";
  } else {
    name = fmt::format("/cohort-{}-link-{}-{}-{}", ::getpid(), kind, comm_.rank, comm_.masterPort);
    try {
      way.channel = std::make_unique<comm::ShmChannel>(name, slotBytes, options_.slots, /*writer=*/true);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  // The receiver takes the name (or "!" and why not), opens the ring and
  // answers: both go over Gloo unless both have it.
  comm_.store->set(key, bytesOf(way.channel ? name : "!" + why));
  if (way.channel) {
    std::string ack;
    try {
      comm_.store->wait({key + "/ack"}, comm_.timeout);
      ack = textOf(comm_.store->get(key + "/ack"));
    } catch (const std::exception& e) {
      throw TimeoutError(fmt::format("rank {}: pipeline {} did not open the shared memory for {} within "
                                     "{} s: {}",
                                     comm_.jobRank(comm_.rank), describeStage(peer), kind,
                                     comm_.timeout.count() / 1000.0, e.what()));
    }
    if (ack != "ok") {
      way.channel.reset();
      why = ack.size() > 1 ? ack.substr(1) : std::string("the receiver could not open it");
    }
  }
  if (way.channel) {
    log::info("pipeline: {} to {} through shared memory ({} slots of {:.3g} MB)", kind, describeStage(peer),
              options_.slots, static_cast<double>(slotBytes) / (1 << 20));
  } else {
    log::info("pipeline: {} to {} over Gloo ({})", kind, describeStage(peer), why);
  }
}

void StageLink::decideIn(Way& way, const char* kind, int peer, const std::vector<int64_t>& sample) {
  way.decided = true;
  const std::string key = fmt::format("link/{}/{}", kind, peer);
  std::string name;
  try {
    comm_.store->wait({key}, comm_.timeout);
    name = textOf(comm_.store->get(key));
  } catch (const std::exception& e) {
    throw TimeoutError(fmt::format("rank {}: pipeline {} did not say how it sends its {} within {} s: {}",
                                   comm_.jobRank(comm_.rank), describeStage(peer), kind,
                                   comm_.timeout.count() / 1000.0, e.what()));
  }
  if (name.empty() || name[0] == '!') return;  // Gloo: the sender says why in its log
  const size_t slotBytes = static_cast<size_t>(options_.maxBatch * elements(sample)) * sizeof(float);
  std::string ack = "ok";
  try {
    way.channel = std::make_unique<comm::ShmChannel>(name, slotBytes, options_.slots, /*writer=*/false);
    way.channel->unlink();  // both sides have it mapped: nothing is left in /dev/shm
  } catch (const Error& e) {
    ack = std::string("!") + e.what();
  }
  comm_.store->set(key + "/ack", bytesOf(ack));
}

void StageLink::send(Way& way, at::Tensor t, int peer, int tag) {
  if (way.channel && t.nbytes() <= way.channel->slotBytes()) {
    const auto start = SteadyClock::now();
    way.channel->write(t.data_ptr(), t.nbytes(), comm_.timeout, describeStage(peer));
    bytesSent += static_cast<int64_t>(t.nbytes());
    sendSeconds += secondsSince(start);
    return;
  }
  post(std::move(t), peer, tag);
}

void StageLink::recv(Way& way, at::Tensor& t, int peer, int tag, const std::string& what) {
  if (way.channel && t.nbytes() <= way.channel->slotBytes()) {
    const auto start = SteadyClock::now();
    way.channel->read(t.data_ptr(), t.nbytes(), comm_.timeout, describeStage(peer));
    bytesReceived += static_cast<int64_t>(t.nbytes());
    recvSeconds += secondsSince(start);
    return;
  }
  receive(t, peer, tag, what);
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
    decideOut(activationsOut_, "activations", comm_.rank + 1, sentSample_);
  } else if (sample != sentSample_) {
    throw Error(fmt::format("pipeline stage {}: a micro-batch's activations are [{}] per sample, but "
                            "earlier ones were [{}]; a stage's output must keep its shape",
                            comm_.rank, fmt::join(sample, ", "), fmt::join(sentSample_, ", ")));
  }
  send(activationsOut_, std::move(t), comm_.rank + 1, kActivationTag);
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
    decideIn(activationsIn_, "activations", from, sample_);
  }
  std::vector<int64_t> shape{batch};
  shape.insert(shape.end(), sample_.begin(), sample_.end());
  at::Tensor x = torch::empty(shape, torch::kFloat);
  recv(activationsIn_, x, from, kActivationTag, fmt::format("receiving the activations of micro-batch {}", micro));
  return x;
}

void StageLink::sendGradient(const at::Tensor& g, int /*micro*/) {
  // The gradients of what the previous stage sent: of its samples' shape.
  if (!gradientsOut_.decided) decideOut(gradientsOut_, "gradients", comm_.rank - 1, sample_);
  send(gradientsOut_, g.detach().to(at::kFloat).contiguous(), comm_.rank - 1, kGradientTag);
}

at::Tensor StageLink::recvGradient(at::IntArrayRef shape, int micro) {
  if (!gradientsIn_.decided) decideIn(gradientsIn_, "gradients", comm_.rank + 1, sentSample_);
  at::Tensor g = torch::empty(shape, torch::kFloat);
  recv(gradientsIn_, g, comm_.rank + 1, kGradientTag, fmt::format("receiving the gradients of micro-batch {}", micro));
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
