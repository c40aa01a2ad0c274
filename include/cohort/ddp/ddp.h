#pragma once

// cohort's data-parallel engine on c10d.
//
// Every parameter's .grad is a view into a flat bucket (gradients are
// produced in place, never copied). Buckets hold parameters in reverse
// registration order, which is roughly the order backward produces their
// gradients, up to bucket_cap_mb each. A post-hook on each parameter's
// gradient accumulator counts down its bucket; when a bucket is complete and
// every bucket before it has been launched, its allreduce starts
// asynchronously, so communication overlaps the rest of backward. Launching
// strictly in bucket order keeps the collectives in the same order on every
// rank whatever order autograd runs in.
//
//   setSyncGradients(sync);   // false on inner accumulation micro-steps
//   loss.backward();          // hooks launch bucket allreduces as they fill
//   finishGradients();        // waits for them; .grad is the mean over ranks
//   optimizer.step(); zeroGrad();

#include <torch/nn/module.h>

#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cohort/comm/comm.h"

namespace torch::autograd {
struct Node;
}

namespace cohort::comm {
class ShmAllreduce;
}

namespace cohort::ddp {

struct DdpOptions {
  double bucketCapMb = 25;
  // false: a parameter without a gradient in a synchronizing step is an
  // error. true: its gradient counts as zero (its bucket then launches only
  // in finishGradients).
  bool findUnusedParameters = false;
  bool broadcastBuffers = true;
  // true: each bucket is divided by the world size before its allreduce, so
  // .grad ends as the mean over ranks. false: the exchange sums, and the
  // caller scales the loss by 1 / world size instead, which costs nothing
  // (autograd carries the scale) where the division is a pass over every
  // gradient: about 8 ms per 64 MB on a CPU.
  bool divideGradients = true;
  // When every rank runs on this machine (and gradients are float32 on the
  // CPU): buckets live in a shared memory segment and are summed there
  // (comm/shm.h) instead of over Gloo's loopback TCP. Falls back to Gloo,
  // with a log line saying why, when that is not possible.
  bool sharedMemory = true;
};

struct DdpStats {
  int64_t buckets = 0;
  int64_t syncs = 0;                  // finishGradients calls that exchanged gradients
  int64_t launchedDuringBackward = 0; // bucket allreduces started from hooks
  int64_t launchedAtFinish = 0;       // started by finishGradients (unused parameters)
  bool sharedMemory = false;          // buckets are exchanged through shared memory
  // Seconds the training thread spent in shared-memory exchanges (they run
  // synchronously inside backward, so all of it is exposed).
  double sharedMemorySeconds = 0;
};

class DistributedDataParallel {
 public:
  // Buckets the module's trainable parameters and hooks them. The module and
  // comm must outlive this object.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, comm::Comm comm,
                          DdpOptions options);
  ~DistributedDataParallel();  // removes the hooks
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Every rank takes rank 0's parameters (trainable or not) and buffers.
  // Blocks (collective).
  void broadcastState();
  // Every rank takes rank 0's buffers (BatchNorm statistics), if
  // broadcast_buffers. Call before anything reads them (evaluation, a
  // save). Blocks (collective).
  void syncBuffers();
  // Whether the next backward exchanges gradients.
  void setSyncGradients(bool sync);
  // After backward of a synchronizing step: launches what hooks did not,
  // waits for every bucket; then each .grad holds the mean over ranks (the
  // sum, with divideGradients false).
  // Throws Error naming the first parameter without a gradient (unless
  // find_unused_parameters) -- after completing the exchange, so the other
  // ranks are not left waiting -- and CommError if a collective fails.
  void finishGradients();
  // After finishGradients: whether every gradient is finite (no NaN or
  // Inf); the same answer on every rank, since the exchanged gradients are
  // the same. Free after a shared-memory exchange (its sums checked every
  // element); otherwise one pass over the buckets.
  bool gradientsFinite() const;
  // Zeroes every gradient (the buckets).
  void zeroGrad();

  // Parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> bucketParameterNames() const;
  DdpStats stats() const;

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
    at::Tensor gradView;
    size_t bucket = 0;
    bool ready = false;
    std::shared_ptr<torch::autograd::Node> accumulator;
    uintptr_t hookKey = 0;
  };
  struct Bucket {
    at::Tensor flat;
    size_t shmOffset = 0;  // floats into this rank's shared memory region
    std::vector<size_t> params;
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
    // The timeline (output.timeline): when the allreduce was launched, and
    // when it completed (microseconds since the epoch, set by Gloo's thread).
    int64_t launchedUs = 0;
    std::shared_ptr<std::atomic<int64_t>> completedUs;
  };

  void onGradReady(size_t index);
  void launchReadyBuckets(bool fromHook);  // mutex_ held
  void resetReadiness();                   // mutex_ held
  // Notes the launch of b's Gloo allreduce and, on completion, its time.
  void traceCompletion(Bucket& b);
  void removeHooks();
  // Places the buckets in shared memory when every rank is on this machine.
  void setUpSharedMemory(int64_t totalFloats);
  // Waits for every launched bucket with one overall deadline; returns the
  // first failure instead of throwing.
  std::exception_ptr waitAll(std::vector<c10::intrusive_ptr<c10d::Work>> works);

  std::shared_ptr<torch::nn::Module> module_;
  comm::Comm comm_;
  DdpOptions options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> frozen_;   // parameters without gradients: broadcast only
  std::vector<at::Tensor> buffers_;
  std::shared_ptr<comm::ShmAllreduce> shm_;
  mutable std::mutex mutex_;
  bool sync_ = true;
  size_t nextLaunch_ = 0;
  // Whether the shared-memory sums of this step so far were finite, and of
  // the last exchange (unset: gradientsFinite() looks at the buckets).
  bool exchangeFinite_ = true;
  std::optional<bool> finiteAfterExchange_;
  DdpStats stats_;
};

}  // namespace cohort::ddp
