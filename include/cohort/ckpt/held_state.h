#pragma once

// Training state a node keeps in memory between rounds of an elastic job
// (docs/elastic.md): the files of a checkpoint in <dir>/step-<N>/ on a
// memory file system (elastic.state_dir), written at once by the training
// thread (no background copy: the rank exits right after). Ranks of one
// node share the directory; each writes its own files and a part manifest,
// part-<rank>.json, listing them (the manifest's fields, its files only).
// manifest.json is written later, by the next round, once the parts of
// every node are put together (elastic/held_state.h).

#include <cstdint>
#include <string>
#include <vector>

#include "cohort/ckpt/checkpointer.h"
#include "cohort/ckpt/manifest.h"

namespace cohort::ckpt {

// "part-<rank>.json".
std::string heldPartFile(int rank);

// Writes `files` (each SnapshotItem's tensor, or what its `make` returns)
// into <dir>/step-<m.step>/, then this rank's part manifest. Sealed with the
// installed keyring's current key, as checkpoints are. Throws IoError.
void writeHeldState(const std::string& dir, Manifest m, const std::vector<SnapshotFile>& files,
                    int rank);

// One step's held state as this node has it: the manifest's fields (from
// any part) and every file the node's parts list that is there with its
// recorded size.
struct HeldStep {
  std::string path;  // <dir>/step-<N>
  Manifest manifest;  // files: what this node holds
};

// The steps under `dir` with at least one readable part, newest first.
std::vector<HeldStep> listHeldState(const std::string& dir);

// The files a checkpoint written by `m.worldSize` ranks must hold to be
// resumed (rank states are optional: a rank without one starts from the
// seed): model.bin, and the optimizer state (and, at ZeRO stage 3, the
// parameters) of every part.
std::vector<std::string> requiredFiles(const Manifest& m);
// Those of requiredFiles(m) that m.files lacks: none when the held state is
// whole.
std::vector<std::string> missingFiles(const Manifest& m);

// Removes every step under `dir` but `keep` (-1: all).
void pruneHeldState(const std::string& dir, int64_t keep);

}  // namespace cohort::ckpt
