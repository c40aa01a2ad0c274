#pragma once

// `cohort ckpt list|verify|inspect PATH`. PATH is a checkpoint directory
// (step-<N>), a directory of them, or a run directory (its checkpoints/).
// Each prints to `out` and returns the exit code.

#include <ostream>
#include <string>

#include "cohort/config/choices.h"

namespace cohort::ckpt {

// One line per checkpoint: step, epoch, position, world size, size, creation
// time and status (valid, incomplete, invalid: why). Sizes are checked, not
// checksums. 0, or 2 when PATH holds no checkpoint directories.
int listCommand(const std::string& path, std::ostream& out);

// Verifies every file's checksum. 0 when every committed checkpoint is valid;
// 1 naming each corrupt or missing file; 2 when PATH holds no checkpoint.
int verifyCommand(const std::string& path, std::ostream& out);

// What one checkpoint holds (the newest valid one for a directory of them):
// the manifest, its files and, with `tensors`, every tensor's name, type and
// shape. 0, or 2 when PATH holds no readable checkpoint.
int inspectCommand(const std::string& path, bool tensors, std::ostream& out);

// The checkpoint PATH names: PATH itself when it holds a manifest, else the
// newest valid one in it or in its checkpoints/; "" when there is none.
std::string findCheckpoint(const std::string& path);

// `cohort ckpt consolidate`: the checkpoint's model.bin as one PyTorch state
// dict at `modelOut` (a safetensors file with `format` safetensors), and with `optimizerOut` its optimizer state (every
// rank's ZeRO parts put back together, ckpt/zero_state.h) in torch.optim's
// state_dict() layout: {"state": {i: {...}}, "param_groups": [{..., "params":
// [0, 1, ...]}]}, parameter i being the i-th of model.bin's with state.
// 0; 2 when PATH holds no valid checkpoint, or `optimizerOut` is asked for
// and the optimizer kept no state. Throws DataError naming a file that
// cannot be read.
int consolidateCommand(const std::string& path, const std::string& modelOut,
                       const std::string& optimizerOut, std::ostream& out,
                       WeightsFormat format = WeightsFormat::pt);

}  // namespace cohort::ckpt
