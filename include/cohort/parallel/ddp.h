#pragma once

// cohort's data-parallel engine on c10d.
//
// Every parameter's .grad is a view into a flat bucket (gradients are
// produced in place, never copied). Buckets hold parameters in reverse
// registration order, which is roughly the order backward produces their
// gradients, up to bucket_cap_mb each. A post-hook on each parameter's
// gradient accumulator counts down its bucket; when a bucket is complete and
// every bucket before it has been launched, its exchange starts, so
// communication overlaps the rest of backward. Launching strictly in bucket
// order keeps the collectives in the same order on every rank whatever
// order autograd runs in. The exchange is a Gloo allreduce (asynchronous), a
// sum in shared memory among the ranks of one machine (synchronous, in the
// hook), or both: hierarchical, across machines (see DdpOptions and
// docs/architecture.md).
//
//   setSyncGradients(sync);   // false on inner accumulation micro-steps
//   loss.backward();          // hooks launch bucket allreduces as they fill
//   finishGradients();        // waits for them; .grad is the mean over ranks
//   optimizer.step(); zeroGrad();
//
// ZeRO (DdpOptions::zeroStage, docs/zero.md): each bucket is padded to a
// multiple of the world size N and cut into N parts; rank r's optimizer
// steps only part r of every bucket (optimizerParameters()), so it holds
// 1/N of the optimizer state, and gatherParameters() then brings every
// rank the other parts. The parameters live in one flat buffer per bucket
// for that (each parameter's data is a view into it). Stage 2 replaces the
// allreduce with a reduce-scatter: rank r receives the sum of part r only,
// into the part's own gradient, and each bucket's full gradients are freed
// once exchanged (allocated again at its next first gradient).
//
//   loss.backward(); finishGradients();   // stage 2: only this rank's part is summed
//   optimizer.step();                     // over optimizerParameters()
//   gatherParameters(); zeroGrad();
//
// Stage 3 shards the parameters too: one bucket per sharding unit (a block
// of the model, DdpOptions::units, and one for the parameters outside
// them), and between uses a rank holds only its part of each. The model
// runs each unit through unitRunner() (models::Model::setUnitRunner): the
// unit's parameters are gathered just before its forward and freed after
// it, gathered again just before its backward, and freed once their
// gradients are in, which are then reduce-scattered and freed too; the
// next unit's gather is launched while the current one computes. Every
// micro-step is reduce-scattered (endMicroStep), so no full gradient
// outlives its unit's backward. On one machine (shared memory) the parts
// live in the segment: a gather copies the other ranks' parts from their
// regions, and a unit's gradients are summed through one unit's staging
// area there; otherwise both are Gloo collectives.

#include <torch/nn/module.h>

#include <cstdint>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cohort/comm/comm.h"
#include "cohort/parallel/options.h"
#include "cohort/models/unit_runner.h"

namespace torch::autograd {
struct Node;
}

namespace cohort::comm {
class ShmAllreduce;
}

namespace cohort::parallel::detail {
struct ExchangePlan;
}

namespace cohort::parallel {

// The unit of `values` (parameters in the model's order, each in its
// parameter's memory layout) as stage 3 cuts it: laid one after the other
// in the bucket's order (the reverse of the model's), each in memory order,
// zero-padded to a multiple of `parts`; part `index` of that, a copy.
at::Tensor cutUnit(const std::vector<std::pair<std::string, at::Tensor>>& values, int parts,
                   int index);

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
  // Inf); the same answer on every rank. Free after a shared-memory
  // exchange (its sums checked every element), and on one rank when every
  // gradient was checked as it was copied into its bucket; otherwise one
  // pass over the buckets, the same on every rank since the exchanged
  // gradients are -- except at ZeRO stage 2 over Gloo, where each rank
  // holds its part's sums only and the verdict is a collective: every rank
  // must call it.
  bool gradientsFinite() const;
  // Drops every gradient for the next backward. Below ZeRO stage 2 the
  // buckets are not zeroed: autograd hands each parameter a fresh gradient
  // and the hook copies it into the bucket (where zeroing the bucket and
  // adding onto it touched it twice more); later micro-steps add to it
  // there. A parameter without one has its slot zeroed when the exchange
  // begins. At stages 2 and 3 the buckets are zeroed. Stage 0 on one rank
  // has no buckets: the fresh gradient stays (later micro-steps add to it),
  // and a parameter without one gets zeros.
  void zeroGrad();

  // What the optimizer steps: the trainable parameters, in registration
  // order (stage 0), or this rank's part of each bucket's flat parameters,
  // one 1-D tensor per bucket whose .grad is its part of the gradient
  // bucket (stages 1, 2). The same tensors for this object's life.
  std::vector<at::Tensor> optimizerParameters() const;
  // For each of optimizerParameters(): which parameter elements it holds,
  // as runs of consecutive elements in the parameter's memory order.
  struct Slice {
    std::string param;   // its name
    int64_t offset = 0;  // first element of the parameter
    int64_t length = 0;
    int64_t at = 0;      // where the run starts in the optimizer parameter
  };
  std::vector<std::vector<Slice>> optimizerSlices() const;
  // Stages 1, 2, after the optimizer step: every rank takes the parts the
  // other ranks stepped. Stage 3 on shared memory: a barrier, so that no
  // rank gathers a part before its owner stepped it. Collective; nothing
  // to do at stage 0.
  void gatherParameters();
  // After finishGradients: the sum of squares of the gradients the
  // optimizer steps, over every rank (a collective at stage 2, where a rank
  // holds the sum of its part only; the same on every rank).
  double gradientSquaredNorm();
  // Multiplies the gradients the optimizer steps by `factor`.
  void scaleGradients(double factor);

  // Stage 3: what runs each unit's forward with its parameters gathered
  // (models::Model::setUnitRunner); nullptr at other stages.
  models::UnitRunner* unitRunner();
  // Stages 2 and 3, after backward of a micro-step that does not
  // synchronize (setSyncGradients(false)): completes its reduce-scatter, so
  // that its full gradients are freed. Nothing to do at other stages.
  void endMicroStep();
  // Stage 3: gathers every unit's parameters on rank `root` until
  // releaseParameters(), for code there that reads the model's parameters
  // directly (the final save); the other ranks only send their parts.
  // Collective; nothing to do at other stages.
  void gatherAllParameters(int root);
  void releaseParameters();
  // The same for bucket k alone (bucketParameterNames()[k]), so that the
  // root holds one unit at a time (the final save, streamed).
  void gatherBucket(int root, size_t k);
  void releaseBucket(size_t k);

  // Parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> bucketParameterNames() const;

  // Stage 3 with DdpOptions::shardFrozen (zero3_frozen.cc): the frozen
  // parameters' buckets, one per unit that has any, the last unit first and
  // those outside every unit last; names in bucket order (as
  // bucketParameterNames()).
  std::vector<std::vector<std::string>> frozenBucketNames() const;
  // The frozen bucket of trainable bucket k's unit, or -1.
  int frozenBucketOf(size_t k) const;
  // Frozen bucket k's parameters gathered on `root` (on every rank when
  // root < 0) until releaseFrozen(k). Collective.
  void gatherFrozen(int root, size_t k);
  void releaseFrozen(size_t k);
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
    int64_t preHook = -1;  // stages 2, 3: the hook that allocates the bucket's gradients
  };
  struct Bucket {
    at::Tensor flat;
    size_t shmOffset = 0;  // floats into this rank's shared memory region (stage 3: of its part)
    std::vector<size_t> params;
    size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor wire;  // what the Gloo sum sends when compressed (detail/gloo_sum.h)
    // ZeRO: floats including the padding to a multiple of the world size;
    // the flat parameters (the parameters are views of it); this rank's
    // part of them, which the optimizer steps; and, stage 2 over Gloo, the
    // N copies of this rank's part the reduce-scatter receives.
    int64_t padded = 0;
    at::Tensor weights;
    at::Tensor part;
    at::Tensor received;
    // Stage 3: whether the storage of `weights` (and of `flat`) is
    // allocated now, and the gather that is filling `weights`.
    bool weightsLive = true;
    bool flatLive = true;
    // Its part came cut (DdpOptions::presharded): nothing to copy, send or cut.
    UnitPart* preset = nullptr;  // its tensor dropped once copied to the segment
    c10::intrusive_ptr<c10d::Work> gather;
    // The timeline (output.timeline): when the allreduce was launched, and
    // when it completed (microseconds since the epoch, set by Gloo's thread).
    int64_t launchedUs = 0;
    std::shared_ptr<std::atomic<int64_t>> completedUs;
  };

  void onGradReady(size_t index);
  // Puts parameter p's gradient into its bucket slot when autograd left
  // it elsewhere (a fresh tensor, or none: zeros). mutex_ held.
  void settleGradient(Param& p);
  // settleGradient without buckets: checks the gradient, or gives zeros.
  void settleWithoutBucket(Param& p);
  void launchReadyBuckets(bool fromHook);  // mutex_ held
  void resetReadiness();                   // mutex_ held
  // Notes the launch of b's Gloo allreduce and, on completion, its time.
  void traceCompletion(Bucket& b);
  void removeHooks();
  // ZeRO (zero.cc): the flat parameters and this rank's parts; stage 2's
  // reduce-scatter of bucket k, and its completion after the wait.
  void setUpParts();
  // Each of b's parameters (indices into `params`) becomes a view of
  // b.weights in its memory layout, its values copied there unless b's part
  // came cut; returns the elements they take.
  int64_t moveIntoWeights(Bucket& b, std::vector<Param>& params);
  void launchReduceScatter(size_t k);
  void completeReduceScatter(size_t k);
  // This rank's part of bucket b's gradients (all of them at stage 0).
  at::Tensor ownGradients(const Bucket& b) const;
  // ownGradients of every bucket; without buckets, each parameter's .grad.
  std::vector<at::Tensor> ownGradientTensors() const;
  // Stage 3 (zero3.cc): buckets by unit; the parts made the only copy;
  // bucket k's parameters gathered (launched, waited for) and freed; its
  // gradient bucket allocated; the runner's hooks before each backward;
  // and the completion of every launched reduce-scatter.
  void bucketByUnit();
  void shardParameters();
  void launchGather(Bucket& b);
  void gatherNow(Bucket& b);
  void allocateWeights(Bucket& b);  // storage for b's parameters (not yet filled)
  void releaseWeights(Bucket& b);
  // b's parameters gathered on `root` alone: the other ranks send.
  void gatherToRoot(Bucket& b, int root);
  void allocateGradients(size_t k);
  void releaseGradients(size_t k);
  void beforeBackward(int unit);  // a shardingUnits() index, or UnitRunner::kWholeModel
  void completeLaunched();
  void finishExchange(bool count);
  // Stage 3 on shared memory: bucket k's parameters copied from every
  // rank's part in the segment; its gradients summed through the staging
  // area into this rank's part gradient (synchronous).
  void gatherFromSharedMemory(Bucket& b);
  void reduceScatterInStaging(size_t k);
  bool unitsInSharedMemory_ = false;
  // Stages 2, 3 on more than one rank: a bucket's full gradients exist only
  // from its first gradient to its reduce-scatter; this rank's part of
  // their sum is the part's own .grad. On shared memory the reduce-scatter
  // goes through a staging area of one bucket in the segment.
  bool shardedGradients_ = false;
  // Stage 0 on one rank: nothing to exchange, so no buckets. Each gradient
  // stays the tensor autograd made (its copy into a bucket was a pass over
  // every gradient each step); the hook only checks it is finite.
  bool withoutBuckets_ = false;
  bool stagingInSharedMemory_ = false;
  size_t stagingShmOffset_ = 0;  // the staging area's floats into this rank's region
  class Runner;
  friend class Runner;
  struct BeforeBackward;
  friend struct BeforeBackward;
  std::shared_ptr<Runner> runner_;
  // Stage 3: elements of the units' buffers allocated now (see DdpStats).
  void noteUnitElements(int64_t delta);
  int64_t unitElements_ = 0;
  std::vector<int> unitBucket_;  // shardingUnits() index -> bucket (-1: none)
  int wholeBucket_ = -1;         // the bucket of the parameters outside every unit
  // Buckets `params` (in registration order) by unit into `out`: the last
  // unit first, the whole-model one last; their parts cut already from
  // `presharded`; each parameter told its bucket. Sets `unitBuckets` to the
  // bucket of each unit (-1: none) and returns the whole model's (or -1).
  int bucketUnits(std::vector<Param>& params, std::vector<Bucket>& out,
                  std::map<std::string, UnitPart>& presharded, std::vector<int>& unitBuckets);
  // The parameter names of each of `list`'s buckets (indices into `params`).
  static std::vector<std::vector<std::string>> namesOf(const std::vector<Bucket>& list,
                                                       const std::vector<Param>& params);
  // DdpOptions::shardFrozen (zero3_frozen.cc): the frozen parameters, by
  // unit as the trainable ones, in buckets of their own; their flat
  // buffers and parts (in the segment after the staging area, on shared
  // memory); and the release of every unit's that is gathered.
  void setUpFrozenParts(size_t shmOffset);
  void releaseAllFrozen();
  // The frozen bucket of unit `unit` (kWholeModel: outside every unit), or -1.
  int frozenOfUnit(int unit) const;
  std::vector<Param> frozenParams_;
  std::vector<Bucket> frozenBuckets_;
  std::vector<int> frozenBucket_;  // shardingUnits() index -> frozen bucket (-1: none)
  int frozenWhole_ = -1;
  int64_t frozenFloats_ = 0;       // of every frozen bucket, with padding
  // Decides the exchange with every rank (detail/exchange.h) and logs it.
  void setUpExchange(int64_t totalFloats, bool floatOnCpu);
  // The shared-memory sum of bucket k inside backward, or without k the
  // claimed sum of every bucket after it; whether it is finite.
  bool sumInSharedMemory(std::optional<size_t> k);
  // Waits for every launched bucket with one overall deadline; returns the
  // first failure instead of throwing.
  std::exception_ptr waitAll(std::vector<c10::intrusive_ptr<c10d::Work>> works,
                             const char* what = "gradient allreduce");

  std::shared_ptr<torch::nn::Module> module_;
  comm::Comm comm_;
  DdpOptions options_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<at::Tensor> frozen_;   // parameters without gradients or excluded: broadcast only
  std::vector<at::Tensor> buffers_;
  std::unique_ptr<detail::ExchangePlan> plan_;
  std::shared_ptr<comm::ShmAllreduce> shm_;  // this machine's ranks, if they share memory
  bool claimedSum_ = false;  // shm_ holds the whole exchange: sumPublished after backward
  int64_t totalFloats_ = 0;  // gradient floats of every bucket, with ZeRO's padding
  // ZeRO stages 1 and 2 on one machine: where the flat parameters start in
  // each region. (At stage 3 each bucket's shmOffset is where its part is.)
  size_t weightsShmOffset_ = 0;
  mutable std::mutex mutex_;
  bool sync_ = true;
  size_t nextLaunch_ = 0;
  // Whether the shared-memory sums of this step so far were finite, and of
  // the last exchange (unset: gradientsFinite() looks at the buckets).
  bool exchangeFinite_ = true;
  std::optional<bool> finiteAfterExchange_;
  // Gradients copied into their buckets this step with every element
  // checked (settleGradient), and whether all of those were finite.
  size_t checkedGradients_ = 0;
  bool checkedFinite_ = true;
  mutable int64_t finitenessPasses_ = 0;
  DdpStats stats_;
};

}  // namespace cohort::parallel
