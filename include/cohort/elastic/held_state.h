#pragma once

// Taking up the state a round left in the nodes' memory (ckpt/held_state.h)
// at the start of the next one, before training: every node tells the
// others which steps and files it holds; the newest step whose files
// together make a whole checkpoint is chosen (the same choice on every
// rank); each file a node lacks is broadcast from a node that holds it; and
// every node writes the step's manifest.json, so that the ordinary resume
// reads it from its own memory. Survivors keep their state; newcomers
// receive it over the network; no disk is read.

#include <cstdint>
#include <string>

#include "cohort/comm/comm.h"

namespace cohort::elastic {

struct TakenUp {
  std::string path;     // this node's step-<N> directory; empty: nothing held is usable
  int64_t step = -1;
  int64_t bytesReceived = 0;  // by this node
  double seconds = 0;
};

// `dir`: this node's elastic.state_dir directory (COHORT_ELASTIC_STATE).
// `diskStep`: the newest valid checkpoint on disk (-1: none), the same on
// every rank; held state older than it is not used. Every rank calls it.
// Throws CommError when a transfer fails, IoError when a file cannot be
// written.
TakenUp takeUpHeldState(const comm::Comm& comm, const std::string& dir, int64_t diskStep);

}  // namespace cohort::elastic
