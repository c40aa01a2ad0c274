#pragma once

// A rank's own part of a checkpoint, rank-<r>.bin: its random state and,
// when buffers are not broadcast (distribution.broadcast_buffers: false),
// its own buffers. Parameters and optimizer state are the same on every rank
// and are rank 0's model.bin and optimizer.bin.

#include <string>
#include <vector>

#include "cohort/ckpt/checkpointer.h"

namespace torch::nn {
class Module;
}

namespace cohort::ckpt {

// The file name of `rank`'s state: "rank-<rank>.bin".
std::string rankStateFile(int rank);
// The optimizer state's file in a checkpoint: optimizer.bin (written by rank
// 0), or with ZeRO (distribution.zero > 0) optimizer-<rank>.bin, each rank's
// parts.
std::string optimizerFile(bool sharded, int rank);
// ZeRO stage 3: each rank's parts of the trainable parameters,
// model-<rank>.bin (model.bin then holds the rest: buffers, frozen weights).
std::string modelPartFile(int rank);

// A pipeline's stage `stage` of `stages` (> 1) writes its files of the
// model and optimizer under its own names: "stage<s>-" + name. One stage:
// name as it is.
std::string stageFile(int stage, int stages, const std::string& name);
// A tensor-parallel rank's slice `slice` of `slices` (> 1) writes its
// files under "slice<t>-" + name (before any stage prefix); one slice: name
// as it is.
std::string sliceFile(int slice, int slices, const std::string& name);

// The items of rank-<r>.bin at this moment: "rng.cpu" (the default CPU
// generator, cloned now; its state tensor is built by the copier thread) and,
// with `ownBuffers`, "buffer.<name>" for every buffer among `modelItems` (the
// items marked `early`).
std::vector<SnapshotItem> rankStateItems(const std::vector<SnapshotItem>& modelItems,
                                         bool ownBuffers);

// Restores <checkpoint>/rank-<rank>.bin: the default CPU generator's state,
// and every saved buffer into `model`'s buffer of that name and shape.
// Throws DataError naming the file when it cannot be read.
void restoreRankState(const std::string& checkpoint, int rank, const torch::nn::Module& model);

}  // namespace cohort::ckpt
