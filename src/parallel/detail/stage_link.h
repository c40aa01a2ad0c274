#pragma once

// What passes between neighbouring pipeline stages of one replica: each
// micro-batch's activations forward (stage s to s+1) and their gradients
// back (s+1 to s). Between stages on one machine through shared memory
// (comm/shm_channel.h: one copy into a ring of slots, one copy out), else
// as Gloo point-to-point messages on the replica's pipeline group
// (parallel/mesh.h). Gloo sends are posted and return at once (the tensor
// is kept until drain()); a shared-memory send returns once copied, and
// waits only when the ring is full. Receives block, with the job's
// timeout, and count as the stage's idle time.
//
// Activations travel as float32. Their shape is [batch] + the shape of one
// sample, which the receiver learns from a header (over Gloo) that precedes
// the first activation: every later micro-batch's batch size is known to
// both sides (every stage of a replica reads the same batches). So is
// whether a message fits a slot; one that does not (a batch larger than
// `maxBatch`) goes over Gloo. Each direction decides on shared memory at
// its first message: the sender creates the ring, the receiver opens it and
// says so through the group's store, and both fall back to Gloo together
// when either cannot.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/comm/shm_channel.h"

namespace cohort::parallel::detail {

struct StageLinkOptions {
  bool sharedMemory = true;  // between stages on one machine (distribution.shared_memory)
  int64_t maxBatch = 0;      // the largest micro-batch: a slot's size; 0: Gloo only
  int slots = 2;             // messages a ring holds unread
};

class StageLink {
 public:
  // This rank is stage `pipeline.rank` of `pipeline.worldSize`. Publishes
  // its machine's identity in the group's store.
  StageLink(const comm::Comm& pipeline, StageLinkOptions options);
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
  // One direction to or from a neighbour: undecided until its first
  // message, then shared memory (a channel) or Gloo.
  struct Way {
    bool decided = false;
    std::unique_ptr<comm::ShmChannel> channel;
  };
  void post(at::Tensor t, int stage, int tag);
  void receive(at::Tensor& t, int stage, int tag, const std::string& what);
  // The sender's and the receiver's half of deciding a direction (`kind`:
  // "activations" or "gradients") with messages of `sample` per sample.
  void decideOut(Way& way, const char* kind, int peer, const std::vector<int64_t>& sample);
  void decideIn(Way& way, const char* kind, int peer, const std::vector<int64_t>& sample);
  // Over the way's channel when it has one and the tensor fits a slot;
  // otherwise over Gloo with `tag`.
  void send(Way& way, at::Tensor t, int peer, int tag);
  void recv(Way& way, at::Tensor& t, int peer, int tag, const std::string& what);
  bool samePlace(int stage);
  std::string describeStage(int stage) const;

  comm::Comm comm_;
  StageLinkOptions options_;
  Way activationsOut_, activationsIn_, gradientsOut_, gradientsIn_;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> pending_;
  std::vector<int64_t> sentSample_;  // the header sent (empty: none yet)
  std::vector<int64_t> sample_;      // the header received (empty: none yet)
};

}  // namespace cohort::parallel::detail
