#pragma once

// A checkpoint's optimizer state in whatever way its run cut it (docs/zero.md):
// one file from rank 0 (optimizer.bin), or with ZeRO one file of parts per
// rank (optimizer-<r>.bin) laid out as the manifest's extra.zero says. These
// functions turn either into one tensor per parameter and kind, and such
// whole state into the parts of another layout, so that a run resumes
// whatever the stage it was written at, and `cohort ckpt consolidate`
// writes one file.
//
// extra.zero: {"stage", "world_size",
//              "buckets": [[parameter name, ...], ...]      (each bucket's, in order)
//              "params": {name: {"shape": [...], "strides": [...]}},
//              stage 3: "model_parts": true, "model_order": [every model.bin name, ...]}
// Bucket k of world size N holds its parameters' elements one after the
// other, each in its memory order (its strides), padded to a multiple of N;
// rank r's part<k> is elements [r c, (r+1) c) with c = padded / N.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cohort/ckpt/state_dict.h"

namespace cohort::ckpt {

struct Manifest;

// Of one stage (and tensor slice `slice`, extra.tensor) of the checkpoint at `dir` (extra.pipeline: its files
// "stage<s>-...", its layout extra.pipeline.stage_zero[s]; stage 0 of a
// checkpoint without a pipeline is the whole). stageModel: its model's
// tensors, model.bin's and with extra.zero.model_parts (stage 3) the
// trainable parameters put back together from every rank's parts
// (modelPartFile: "part<k>", bucket k's parameter part), in the model's
// order (extra.zero.model_order); every stage's at once, one tensor at a
// time, is CheckpointTensors (stage_tensors.h). Each throws DataError
// naming the file that is missing or does not fit the layout.
// stageOptimizerState: the stage's optimizer state as
// train::optimizerState() names it for an unsharded run ("<param>.step",
// "<param>.exp_avg", "<param>.exp_avg_sq" for adamw,
// "<param>.momentum_buffer" for sgd), each of its parameter's shape.
// All of them read through StageTensors (stage_tensors.h), which reads one
// tensor or bucket at a time.
StateDict stageOptimizerState(const std::string& dir, const Manifest& m, int stage, int slice = 0);
// The ZeRO layout stage `stage` was written with (extra.zero without a
// pipeline); null without ZeRO.
nlohmann::json stageZeroLayout(const std::string& dir, const Manifest& m, int stage);
StateDict stageModel(const std::string& dir, const Manifest& m, int stage, int slice = 0);

// ZeRO stage 3 resumed in the same cut: rank `rank`'s parameter parts of
// stage `stage` (its model-<rank>.bin), one per bucket of `buckets` (each
// bucket's parameter names in its order), when the checkpoint was written
// at stage 3 by `world` ranks (of the stage) with those buckets; nullopt
// for any other layout. Reads that one file: no step holds the model.
// Throws DataError naming the file when a part is missing or of another size.
std::optional<std::vector<at::Tensor>> ownModelParts(const std::string& dir, const Manifest& m,
                                                     int stage, int world, int rank,
                                                     const std::vector<std::vector<std::string>>& buckets);
// Every stage's model tensors one at a time: `visit` sees each stage's model
// tensors in the model's order, a ZeRO-3 bucket's parameters put together
// from every rank's part, a name two stages hold once; what it is given
// may be dropped, so no more than one bucket is held (`cohort ckpt
// consolidate`). Returns every name in the model's order.
using TensorVisit = std::function<void(const std::string& name, const at::Tensor& t)>;
std::vector<std::string> visitCheckpointModel(const std::string& dir, const Manifest& m,
                                              const TensorVisit& visit);

// The stage's model.bin: what is not a parameter part at stage 3.
StateDict stageModelRest(const std::string& dir, const Manifest& m, int stage);

// One part of a layout: which runs of which parameters' elements (in their
// memory order) it holds, and where in the part.
struct PartSlice {
  std::string param;
  int64_t offset = 0;  // first element of the parameter
  int64_t length = 0;
  int64_t at = 0;      // where the run starts in the part
};

// The state of parts "<name>.<kind>" (names[k] for part k, of parts[k]'s
// slices and sizes[k] elements) cut from `whole`, which gives one tensor of
// the unsharded state by name (stageOptimizerState's names; undefined when
// the checkpoint has none: StageTensors::optimizerState), with
// each parameter's elements in the memory order of `live` (this run's
// parameters by name, for their strides). A part's step count is that of
// its first parameter. Throws DataError naming `origin` when a parameter's
// state is missing or of another shape.
using StateLookup = std::function<at::Tensor(const std::string& name)>;
StateDict partsFromWhole(const StateLookup& whole, const std::vector<std::string>& names,
                         const std::vector<std::vector<PartSlice>>& parts,
                         const std::vector<int64_t>& sizes, const StateDict& live,
                         const std::string& origin);

}  // namespace cohort::ckpt
