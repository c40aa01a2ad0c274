#pragma once

// One pipeline stage of a checkpoint (the whole model without a pipeline),
// read one tensor at a time whatever way its run cut it (docs/zero.md,
// "Built, loaded and saved unit by unit"): model.bin's tensors by name, a
// ZeRO stage 3 parameter from its bucket's part in every rank's file, and
// the optimizer state of optimizer.bin or of every rank's parts. A bucket
// is put together once and kept until the next one is asked for, so that
// reading a sharded checkpoint in its buckets' order holds one bucket (one
// unit) besides what the caller keeps. Each file is opened once (a sealed
// one decrypted in memory then, docs/security.md).
//
// The layout is checkpoint extra.zero (zero_state.h describes it).

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/ckpt/state_dict.h"
#include "cohort/ckpt/tensor_file.h"

namespace cohort::ckpt {

struct Manifest;

class StageTensors : public TensorSource {
 public:
  // Reads the manifest's layout and model.bin's header; throws DataError
  // naming manifest.json or the file when the layout does not hold together.
  // `slice`: a tensor-parallel checkpoint's (extra.tensor) slice of the
  // stage, whose files are "slice<t>-..." (ckpt::sliceFile).
  StageTensors(const std::string& dir, const Manifest& m, int stage, int slice = 0);
  ~StageTensors() override;

  // The stage's model tensors in the model's order (extra.zero.model_order
  // at stage 3, else model.bin's), without data.
  const StateDict& entries() const override;
  at::Tensor load(const std::string& name) override;
  void drop(const std::string& name) override;
  // Indices [begin, end) of model tensor `name` along `dim`: only their
  // bytes, from model.bin or the ZeRO stage 3 parts that hold them.
  at::Tensor loadRange(const std::string& name, int64_t dim, int64_t begin, int64_t end);
  // Bytes read from the files so far.
  uint64_t bytesRead() const;

  // Every optimizer state tensor the checkpoint holds for this stage, as
  // an unsharded run names it ("<param>.exp_avg", "<param>.step", ...), in
  // the order the files hold them (by bucket at ZeRO).
  std::vector<std::string> optimizerNames();
  // One of those, read now (bucket by bucket as load()); undefined when the
  // checkpoint holds no such state.
  at::Tensor optimizerState(const std::string& name);
  // The unsharded optimizer.bin of this stage (and slice), opened once.
  const TensorFileReader& optimizerReader();
  // The shape of optimizer state `name` (empty when the checkpoint holds
  // none), and indices [begin, end) of it along `dim`: only their bytes,
  // from optimizer.bin or from the ranks' parts that hold them.
  std::vector<int64_t> optimizerShape(const std::string& name);
  at::Tensor optimizerStateRange(const std::string& name, int64_t dim, int64_t begin, int64_t end);

  // extra.zero of this stage (null without ZeRO) and its files' names.
  const nlohmann::json& zero() const;
  std::string file(const std::string& name) const;
  int stages() const { return stages_; }  // of the checkpoint's pipeline (1: none)
  int slices() const { return slices_; }  // of its tensor split (1: none)
  // The elements of bucket k of the layout (before padding).
  int64_t bucketElements(size_t k) const;

 private:
  struct Bucketed;
  const TensorFileReader& reader(const std::string& name);
  // Bucket k of `files` (one per rank) put together into `cache`.
  void unpack(Bucketed& b, size_t k);
  // Indices [begin, end) along `dim` of bucketed parameter `name`'s tensor
  // (its parts' key + `suffix`): read from the ranks' parts that hold
  // them (along another dimension than the first, the whole parameter's).
  at::Tensor partRange(Bucketed& b, const std::string& name, const std::string& suffix, int64_t dim, int64_t begin,
                       int64_t end);
  // Throws DataError: rank r's part `key` of bucket k is missing
  // (`elements` < 0) or not of `chunk` elements; names what it held.
  [[noreturn]] void lacksPart(const std::string& path, const std::string& key, const std::string& suffix,
                              int64_t elements, int r, int64_t chunk, size_t k) const;

  std::string dir_;
  int stage_ = 0;
  int stages_ = 1;
  int slice_ = 0;
  int slices_ = 1;
  nlohmann::json zero_;
  StateDict entries_;
  std::map<std::string, size_t> bucketOf_;  // a parameter of a part: its bucket
  std::map<std::string, std::unique_ptr<TensorFileReader>> readers_;
  std::unique_ptr<Bucketed> model_, optimizer_;
};

// Every stage of a checkpoint as one TensorSource: each stage's model
// tensors in stage order, a name two stages hold (a pipeline's tied
// embedding) taken from the first: the checkpoint's model, read one tensor
// at a time. A tensor-parallel checkpoint's split tensors are put together
// from every slice's file as they are read. Its extra.tensor:
// {"tensors": T, "sequence_parallel": bool, "cuts": {name: {"dim": d,
// "blocks": b}, ...}} for every split tensor of model.bin; the others are
// whole in every slice's file. A slice that lacks its region of a tensor
// (or holds it in another shape) throws DataError naming the tensor, the
// slice and the rows or columns it held; so does a ZeRO part that is
// missing or short, naming the elements of each tensor it held.
class CheckpointTensors : public TensorSource {
 public:
  CheckpointTensors(const std::string& dir, const Manifest& m);
  const StateDict& entries() const override { return entries_; }
  at::Tensor load(const std::string& name) override;
  void drop(const std::string& name) override;
  // The region of whole tensor `name` that rank `index` of `parts` holds
  // when it is cut along `dim` in `blocks` blocks, each cut in `parts`
  // (parallel::sliceByCut's): only its bytes, read from the slices' files
  // that hold it. Another cut than the checkpoint's is read whole and cut.
  at::Tensor loadRegion(const std::string& name, int64_t dim, int blocks, int parts, int index);
  // Bytes read from the checkpoint's files so far, and the bytes of every
  // tensor entries() lists (what reading them all whole would take).
  uint64_t bytesRead() const;
  uint64_t bytesWhole() const;

 private:
  std::string dir_;
  // One per stage and slice: stage s's slice t at s x slices + t.
  std::vector<std::unique_ptr<StageTensors>> stages_;
  int slices_ = 1;
  std::map<std::string, std::pair<int64_t, int>> cuts_;  // a split tensor: its dim and blocks
  StateDict entries_;
  std::map<std::string, size_t> stageOf_;  // the index of its stage's slice 0
};

// The optimizer state of every stage (and tensor slice) of a checkpoint,
// by the names a run of the whole model without ZeRO gives it
// ("<param>.<kind>"): a parameter's from the first stage that holds it, a
// split parameter's put together from its slices (its step count from
// slice 0). One bucket of a sharded state is held at a time per stage.
class CheckpointOptimizer {
 public:
  CheckpointOptimizer(const std::string& dir, const Manifest& m);
  ~CheckpointOptimizer();
  // Every state name, the first stage's first, each in its files' order.
  const std::vector<std::string>& names() const { return names_; }
  int stages() const { return static_cast<int>(stages_.size()); }
  // One of names() read now; undefined when the checkpoint holds no such state.
  at::Tensor state(const std::string& name);
  // Its region as CheckpointTensors::loadRegion's: only the region's
  // bytes, from optimizer.bin or the ZeRO parts that hold them.
  at::Tensor stateRegion(const std::string& name, int64_t dim, int blocks, int parts, int index);

 private:
  std::string dir_;
  std::vector<std::vector<std::unique_ptr<StageTensors>>> stages_;  // [stage][slice]
  std::map<std::string, std::pair<int64_t, int>> cuts_;             // a split parameter: dim, blocks
  std::map<std::string, size_t> holder_;                            // a state name: its stage
  std::vector<std::string> names_;
};

// The whole tensor of `slices` (each rank's of a tensor split, in rank
// order) cut along `dim`, which is `blocks` equal blocks each cut in
// slices.size() (a fused query/key/value projection: 3 blocks).
at::Tensor joinSlices(const std::vector<at::Tensor>& slices, int64_t dim, int blocks);

}  // namespace cohort::ckpt
