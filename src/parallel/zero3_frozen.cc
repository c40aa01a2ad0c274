// ZeRO stage 3's frozen parameters (DdpOptions::shardFrozen, docs/zero.md):
// a LoRA job's base weights held in parts as the trainable ones are, in
// buckets of their own by unit, so that no rank holds the whole base. A
// unit's frozen bucket is gathered beside its trainable one around the
// unit's forward and again before its backward, and released after; it
// has no gradients, no optimizer state and no place in a checkpoint (the
// base is model.init_from's).

#include <fmt/format.h>
#include <torch/torch.h>

#include "cohort/comm/shm.h"
#include "cohort/core/error.h"
#include "cohort/parallel/ddp.h"
#include "parallel/detail/unit_memory.h"

namespace cohort::parallel {

void DistributedDataParallel::setUpFrozenParts(size_t shmOffset) {
  torch::NoGradGuard noGrad;
  const int world = comm_.worldSize;
  for (Bucket& b : frozenBuckets_) {
    const at::TensorOptions options = frozenParams_[b.params.front()].tensor.options();
    const int64_t chunk = b.padded / world;
    // As the trainable buckets (setUpParts): each parameter becomes a view
    // of the flat buffer, its values copied there unless the part came cut.
    b.weights = detail::unitBuffer(b.padded, options);
    const int64_t offset = moveIntoWeights(b, frozenParams_);
    at::Tensor own;
    if (b.preset != nullptr) {
      own = b.preset->part;
      if (own.numel() != chunk || own.scalar_type() != options.dtype().toScalarType()) {
        throw Error(fmt::format("ZeRO stage 3: a frozen part cut beforehand holds {} {} elements, "
                                "the engine's {} {}",
                                own.numel(), c10::toString(own.scalar_type()), chunk,
                                c10::toString(options.dtype().toScalarType())));
      }
      own = own.to(options.device());
      models::releaseStorage(b.weights);
      b.weightsLive = false;
    } else {
      if (offset < b.padded) b.weights.narrow(0, offset, b.padded - offset).zero_();
      own = b.weights.narrow(0, chunk * comm_.rank, chunk);
      noteUnitElements(b.padded);  // whole until shardParameters()
    }
    if (unitsInSharedMemory_) {
      // After the staging area in this rank's region; written before the
      // barrier that ends the sharding, and never again.
      b.shmOffset = shmOffset;
      shmOffset += static_cast<size_t>(chunk);
      auto keep = shm_;
      b.part = torch::from_blob(shm_->region() + b.shmOffset, {chunk},
                                [keep](void*) mutable { keep.reset(); }, options)
                   .copy_(own);
      if (b.preset != nullptr) b.preset->part = at::Tensor();  // the segment holds it now
    } else {
      b.part = b.preset != nullptr ? own : own.clone();
    }
    stats_.frozenElements += chunk;
  }
}

int DistributedDataParallel::frozenOfUnit(int unit) const {
  if (unit == models::UnitRunner::kWholeModel) return frozenWhole_;
  if (unit < 0 || static_cast<size_t>(unit) >= frozenBucket_.size()) return -1;
  return frozenBucket_[static_cast<size_t>(unit)];
}

void DistributedDataParallel::releaseAllFrozen() {
  for (Bucket& b : frozenBuckets_) releaseWeights(b);
}

std::vector<std::vector<std::string>> DistributedDataParallel::frozenBucketNames() const {
  return namesOf(frozenBuckets_, frozenParams_);
}

int DistributedDataParallel::frozenBucketOf(size_t k) const {
  if (static_cast<int>(k) == wholeBucket_) return frozenWhole_;
  for (size_t u = 0; u < unitBucket_.size(); ++u) {
    if (unitBucket_[u] == static_cast<int>(k)) return frozenOfUnit(static_cast<int>(u));
  }
  return -1;
}

void DistributedDataParallel::gatherFrozen(int root, size_t k) {
  COHORT_ASSERT(k < frozenBuckets_.size(), "frozen bucket ", k);
  if (root < 0) {
    gatherNow(frozenBuckets_[k]);
  } else {
    gatherToRoot(frozenBuckets_[k], root);
  }
}

void DistributedDataParallel::releaseFrozen(size_t k) {
  COHORT_ASSERT(k < frozenBuckets_.size(), "frozen bucket ", k);
  releaseWeights(frozenBuckets_[k]);
}

}  // namespace cohort::parallel
