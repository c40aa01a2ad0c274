#pragma once

// What passes between neighbouring pipeline stages of one replica: each
// micro-batch's activations forward (stage s to s+1) and their gradients
// back (s+1 to s), as Gloo point-to-point messages on the replica's
// pipeline group (parallel/mesh.h). Sends are posted and return at once
// (the tensor is kept until drain()); receives block, with the job's
// timeout, and count as the stage's idle time.
//
// Activations travel as float32. Their shape is [batch] + the shape of one
// sample, which the receiver learns from a header that precedes the first
// activation: every later micro-batch's batch size is known to both sides
// (every stage of a replica reads the same batches).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cohort/comm/comm.h"

namespace cohort::parallel::detail {

class StageLink {
 public:
  // This rank is stage `pipeline.rank` of `pipeline.worldSize`.
  explicit StageLink(const comm::Comm& pipeline);
  ~StageLink();
  StageLink(const StageLink&) = delete;
  StageLink& operator=(const StageLink&) = delete;

  // To the next stage: micro-batch `micro`'s activations [batch, ...].
  void sendActivation(const at::Tensor& y, int micro);
  // From the previous stage: micro-batch `micro`'s activations, of `batch`
  // samples. Throws CommError (a peer failed) or TimeoutError naming the
  // stage and its rank.
  at::Tensor recvActivation(int64_t batch, int micro);
  // To the previous stage: the gradient of the activations it sent.
  void sendGradient(const at::Tensor& g, int micro);
  // From the next stage: the gradient of what this stage sent, of `shape`.
  at::Tensor recvGradient(at::IntArrayRef shape, int micro);
  // Tensors to rank `stage` of the group (another tag: the final save).
  void sendTensor(const at::Tensor& t, int stage);
  void recvTensor(at::Tensor& t, int stage);
  // Waits until every posted send is complete.
  void drain();

  double recvSeconds = 0;  // blocked in receives
  double sendSeconds = 0;  // posting sends and draining them
  int64_t bytesSent = 0;
  int64_t bytesReceived = 0;

 private:
  void post(at::Tensor t, int stage, int tag);
  void receive(at::Tensor& t, int stage, int tag, const std::string& what);
  std::string describeStage(int stage) const;

  comm::Comm comm_;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> pending_;
  std::vector<int64_t> sentSample_;  // the header sent (empty: none yet)
  std::vector<int64_t> sample_;      // the header received (empty: none yet)
};

}  // namespace cohort::parallel::detail
